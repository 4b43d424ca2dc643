"""TFF's local C++ runtime with a worker process that never outlives us.

`import tensorflow_federated` installs a default context whose worker binary
can survive the interpreter (its cleanup runs in `__del__` at exit, when
`subprocess` may already be torn down). Here the worker is started by us:

* with `PR_SET_PDEATHSIG` (Linux), so the kernel ends it even when the
  driver is killed with SIGKILL;
* registered with `atexit` and ended on `close()`, normal exit, exceptions
  and Ctrl-C (KeyboardInterrupt unwinds through the context manager);
* SIGTERM is turned into `SystemExit` so the same clean-up runs.

Typical use (programs and tests):

    with tff_fair.runtime.local_context(max_concurrent_computation_calls=4):
      state = process.initialize()
"""

import atexit
import contextlib
import ctypes
import gc
import signal
import subprocess
import sys
import threading
import time
from typing import Optional, Protocol

from absl import logging
import grpc
import portpicker
import tensorflow_federated as tff

from tff_fair.runtime import binary as binary_lib
from tff_fair.runtime import quiet_startup

_PR_SET_PDEATHSIG = 1
_READY_TIMEOUT_SECONDS = 60.0
GRPC_OPTIONS = [
    ('grpc.max_receive_message_length', -1),
    ('grpc.max_send_message_length', -1),
]


def _die_with_parent() -> None:  # Runs in the child between fork and exec.
  try:
    libc = ctypes.CDLL('libc.so.6', use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except OSError:
    pass  # Not Linux: atexit and close() still end the worker.


class LocalWorker:
  """One TFF C++ worker process on a loopback port, owned by this process."""

  _live: set['LocalWorker'] = set()
  _live_lock = threading.Lock()

  def __init__(self, max_concurrent_computation_calls: int = -1):
    self._max_calls = max_concurrent_computation_calls
    self._process: Optional[subprocess.Popen[bytes]] = None
    self._stub: Optional[tff.framework.RemoteExecutorGrpcStub] = None
    self.port: Optional[int] = None

  @property
  def pid(self) -> Optional[int]:
    return self._process.pid if self._process else None

  def stub(self) -> 'tff.framework.RemoteExecutorGrpcStub':
    """Starts the worker if needed and returns a ready gRPC stub."""
    if self._stub is not None and self._process.poll() is None:
      return self._stub
    if self._process is not None:
      logging.warning(
          'TFF worker (pid %d) exited with code %s; starting a new one.',
          self._process.pid,
          self._process.returncode,
      )
      self.close()
    binary = binary_lib.worker_binary_path()
    self.port = portpicker.pick_unused_port()
    self._process = subprocess.Popen(
        [
            binary,
            f'--port={self.port}',
            f'--max_concurrent_computation_calls={self._max_calls}',
        ],
        # The worker's output goes to our stderr, less known start-up noise;
        # it never holds our stdout, so `program | tail` ends when we do.
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,
    )
    quiet_startup.forward_filtered(self._process.stdout, sys.stderr)
    with LocalWorker._live_lock:
      LocalWorker._live.add(self)
    channel = grpc.insecure_channel(f'localhost:{self.port}', GRPC_OPTIONS)
    stub = tff.framework.RemoteExecutorGrpcStub(channel)
    deadline = time.monotonic() + _READY_TIMEOUT_SECONDS
    while not stub.is_ready:
      if self._process.poll() is not None:
        raise RuntimeError(
            f'TFF worker exited with code {self._process.returncode} while'
            ' starting; see the log above.'
        )
      if time.monotonic() > deadline:
        self.close()
        raise RuntimeError(
            f'TFF worker on port {self.port} not ready after'
            f' {_READY_TIMEOUT_SECONDS:.0f} s.'
        )
      time.sleep(0.05)
    self._stub = stub
    return stub

  def close(self) -> None:
    """Ends the worker (SIGINT, then SIGKILL after 10 s) and waits for it."""
    process, self._process, self._stub = self._process, None, None
    with LocalWorker._live_lock:
      LocalWorker._live.discard(self)
    if process is None or process.poll() is not None:
      return
    process.send_signal(signal.SIGINT)
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()

  @classmethod
  def close_all(cls) -> None:
    with cls._live_lock:
      workers = list(cls._live)
    for worker in workers:
      worker.close()


atexit.register(LocalWorker.close_all)


def _raise_system_exit(signum, frame):
  del frame
  raise SystemExit(128 + signum)


def install_sigterm_handler() -> None:
  """Makes SIGTERM unwind like Ctrl-C so workers and files are closed."""
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _raise_system_exit)


class _HasStub(Protocol):

  def stub(self) -> tff.framework.RemoteExecutorStub:
    ...


def executor_factory(
    worker: _HasStub, default_num_clients: int = 0
) -> tff.framework.ResourceManagingExecutorFactory:
  """Executors that run computations on `worker` (local or remote)."""

  def stack_fn(cardinalities):
    # Without a CLIENTS cardinality the worker refuses server-only calls.
    cardinalities.setdefault(tff.CLIENTS, default_num_clients)
    executor = tff.framework.RemoteExecutor(worker.stub())
    executor.set_cardinalities(cardinalities)
    return executor

  return tff.framework.ResourceManagingExecutorFactory(stack_fn)


_CONTEXT_ARGS = dict(
    compiler_fn=tff.backends.native.desugar_and_transform_to_native,
    transform_args=tff.tensorflow.transform_args,
    transform_result=tff.tensorflow.transform_result,
)


def create_context(
    worker: _HasStub, default_num_clients: int = 0
) -> tff.framework.SyncExecutionContext:
  """A sync execution context whose computations run on `worker`."""
  return tff.framework.SyncExecutionContext(
      executor_fn=executor_factory(worker, default_num_clients),
      **_CONTEXT_ARGS)


def create_async_context(
    worker: _HasStub, default_num_clients: int = 0
) -> tff.framework.AsyncExecutionContext:
  """An async execution context on `worker` (for TFF's mergeable context)."""
  return tff.framework.AsyncExecutionContext(
      executor_fn=executor_factory(worker, default_num_clients),
      **_CONTEXT_ARGS)


def install_idle_context(max_concurrent_computation_calls: int = -1) -> None:
  """Makes an idle local context of ours TFF's default.

  It starts a worker only if used (and then ends it at exit), unlike TFF's
  import-time default, whose clean-up fails at interpreter exit and leaves
  its worker running.
  """
  tff.framework.set_default_context(
      create_context(LocalWorker(max_concurrent_computation_calls)))
  gc.collect()


@contextlib.contextmanager
def local_context(max_concurrent_computation_calls: int = -1):
  """Installs a local C++ context as TFF's default for the `with` body.

  Args:
    max_concurrent_computation_calls: Upper bound on computations the worker
      runs at once (e.g. clients trained in parallel); non-positive means no
      limit. Lower it to cap memory with large models.

  Yields:
    The `LocalWorker` (its `pid` is useful in tests).
  """
  worker = LocalWorker(max_concurrent_computation_calls)
  install_sigterm_handler()
  tff.framework.set_default_context(create_context(worker))
  try:
    yield worker
  finally:
    install_idle_context(max_concurrent_computation_calls)
    worker.close()


install_idle_context()
