"""TFF's remote executor stack: computations on worker binaries over gRPC.

Workers are TFF's C++ `worker_binary` processes (start them with
`python -m programs.worker --port=P` on each host). This module only connects
to them; it never starts or ends a remote worker.

* One worker: a `tff.framework.SyncExecutionContext` on a `RemoteExecutor`.
* Several workers: TFF's `MergeableCompExecutionContext`, which splits the
  clients of one call into one sub-round per worker and merges the partial
  aggregates. It is only correct for computations whose results are not
  CLIENTS-placed (TFF 0.87 returns wrong client values for those without an
  error), so `MultiWorkerContext` refuses them with a message that points to
  `map_clients`, which runs a per-client computation on shards of the clients,
  one shard per worker.

Failures never hang. TFF retries a call that fails with gRPC UNAVAILABLE
forever (`AsyncExecutionContext.invoke`), which is a hang when a worker has
died. Here each worker's stub turns an UNAVAILABLE it cannot recover from
within `reconnect_seconds` into `WorkerUnavailableError`, which names the
worker and is not retried; and a monitor thread probes every worker on a
fresh connection so that a worker that stops answering without closing its
connection (a frozen process, a host gone from the network) is detected too:
its channel is closed, which cancels the call that waits on it.

The worker channel is unencrypted and unauthenticated (TFF's worker binary
serves plain gRPC): run workers on a private network only.
"""

import concurrent.futures
import contextlib
import dataclasses
import subprocess
import threading
import time
from typing import Any, Callable, Sequence

from absl import logging
import grpc
import tensorflow_federated as tff

from tff_fair import errors
from tff_fair.runtime import local

# A probe must open its own connection: with the shared subchannel pool it
# would reuse the connection under test and always look healthy.
_PROBE_OPTIONS = [('grpc.use_local_subchannel_pool', 1)]


class ExecutorConfigError(errors.UserError, ValueError):
  """The executor settings (e.g. --workers) are invalid."""


class WorkerUnavailableError(RuntimeError):
  """A TFF worker cannot be reached or stopped answering."""

  def __init__(self, address: str, detail: str):
    """`address`: 'host:port' of the worker (or several, comma-separated)."""
    self.address = address
    port = address.rsplit(':', 1)[1] if ',' not in address else 'PORT'
    super().__init__(
        f'TFF worker {address} {detail}. Check that the worker runs (start'
        f' it with: python -m programs.worker --port={port} on that host)'
        ' and is reachable from here; then re-run the same command:'
        ' training resumes from the last checkpoint.')


@dataclasses.dataclass(frozen=True)
class WorkerAddress:
  host: str
  port: int

  def __str__(self) -> str:
    return f'{self.host}:{self.port}'


def parse_workers(spec: str) -> list[WorkerAddress]:
  """Parses `host:port,host:port,...`; raises ExecutorConfigError."""
  entries = [e.strip() for e in spec.split(',') if e.strip()]
  if not entries:
    raise ExecutorConfigError(
        '--workers is empty; give host:port of each TFF worker, e.g.'
        ' --workers=10.0.0.5:8000,10.0.0.6:8000.')
  addresses = []
  for entry in entries:
    host, sep, port = entry.rpartition(':')
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ExecutorConfigError(
          f'--workers entry {entry!r} is not host:port with a port in'
          ' 1..65535 (e.g. localhost:8000).')
    address = WorkerAddress(host.strip('[]'), int(port))
    if address in addresses:
      raise ExecutorConfigError(f'--workers lists {entry} twice.')
    addresses.append(address)
  return addresses


def probe(address: WorkerAddress, timeout_seconds: float) -> bool:
  """True if a new gRPC connection to `address` becomes ready in time."""
  channel = grpc.insecure_channel(str(address), _PROBE_OPTIONS)
  try:
    grpc.channel_ready_future(channel).result(timeout=timeout_seconds)
    return True
  except grpc.FutureTimeoutError:
    return False
  finally:
    channel.close()


def _describe(error: Exception) -> str:
  """One line for a gRPC error (its repr spans several lines)."""
  if isinstance(error, grpc.Call):
    return f'gRPC {error.code().name}: {error.details()}'
  return f'{type(error).__name__}: {error}'


def wait_until_ready(address: WorkerAddress, process: subprocess.Popen,
                     timeout_seconds: float = 60.0) -> None:
  """Waits until a worker just started as `process` answers at `address`.

  Raises:
    WorkerUnavailableError: If the process exits or the time runs out.
  """
  deadline = time.monotonic() + timeout_seconds
  while not probe(address, 1.0):
    if process.poll() is not None or time.monotonic() > deadline:
      raise WorkerUnavailableError(str(address), 'did not start')


class _GuardedStub(tff.framework.RemoteExecutorStub):
  """A worker's gRPC stub whose failures name the worker and never loop."""

  def __init__(self, worker: 'RemoteWorker'):
    self._worker = worker
    self._stub = tff.framework.RemoteExecutorGrpcStub(worker.channel)

  def _call(self, method: str, request):
    worker = self._worker
    if worker.lost:
      raise WorkerUnavailableError(str(worker.address), worker.lost)
    try:
      return getattr(self._stub, method)(request)
    except Exception as e:  # pylint: disable=broad-except
      if worker.lost:  # The monitor closed the channel under this call.
        raise WorkerUnavailableError(str(worker.address), worker.lost) from e
      if not isinstance(e, tff.framework.RetryableError):
        raise
      # UNAVAILABLE: TFF would retry forever. Retry only if the worker is
      # back within the grace period (a network blip), and a few times.
      worker.retries += 1
      if (worker.retries <= worker.max_retries and
          probe(worker.address, worker.reconnect_seconds)):
        logging.warning('TFF worker %s: %s; retrying the call.',
                        worker.address, e)
        raise
      worker.mark_lost(f'stopped answering ({_describe(e)})')
      raise WorkerUnavailableError(str(worker.address), worker.lost) from e

  def get_executor(self, request):
    return self._call('get_executor', request)

  def create_value(self, request):
    return self._call('create_value', request)

  def create_struct(self, request):
    return self._call('create_struct', request)

  def create_call(self, request):
    return self._call('create_call', request)

  def create_selection(self, request):
    return self._call('create_selection', request)

  def compute(self, request):
    response = self._call('compute', request)
    self._worker.retries = 0  # A result came back: the worker works.
    return response

  def dispose(self, request):
    if self._worker.lost:
      return None  # Nothing is left to free on a lost worker.
    return self._call('dispose', request)

  def dispose_executor(self, request):
    if self._worker.lost:
      return None
    return self._call('dispose_executor', request)

  @property
  def is_ready(self) -> bool:
    return self._stub.is_ready


class RemoteWorker:
  """A connection to one TFF worker, with the state of its health.

  Attributes:
    address: Where the worker listens.
    lost: '' while healthy; else why it was given up.
  """

  def __init__(self, address: WorkerAddress, reconnect_seconds: float = 10.0,
               max_retries: int = 3):
    self.address = address
    self.reconnect_seconds = reconnect_seconds
    self.max_retries = max_retries
    self.retries = 0
    self.lost = ''
    self.channel = grpc.insecure_channel(str(address), local.GRPC_OPTIONS)
    self._stub = _GuardedStub(self)

  def stub(self) -> tff.framework.RemoteExecutorStub:
    return self._stub

  def mark_lost(self, reason: str) -> None:
    """Gives the worker up; calls waiting on it fail at once."""
    if not self.lost:
      self.lost = reason
      logging.error('TFF worker %s %s.', self.address, reason)
      self.channel.close()  # Cancels RPCs in flight on this channel.

  def close(self) -> None:
    self.channel.close()


class WorkerMonitor:
  """Probes workers in the background; gives up one that stops answering.

  A worker that misses `misses` consecutive probes (each waits up to
  `timeout_seconds`, one every `interval_seconds`) is marked lost. The
  defaults detect a silent worker within about 20 s.
  """

  def __init__(self, workers: Sequence[RemoteWorker],
               interval_seconds: float = 4.0, timeout_seconds: float = 5.0,
               misses: int = 2):
    self._workers = list(workers)
    self._interval = interval_seconds
    self._timeout = timeout_seconds
    self._misses = misses
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name='tff-worker-monitor')

  def start(self) -> None:
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    self._thread.join()

  def _run(self) -> None:
    missed = {id(w): 0 for w in self._workers}
    while not self._stop.wait(self._interval):
      for worker in self._workers:
        if worker.lost or self._stop.is_set():
          continue
        if probe(worker.address, self._timeout):
          missed[id(worker)] = 0
          continue
        missed[id(worker)] += 1
        if missed[id(worker)] >= self._misses:
          worker.mark_lost(
              f'did not answer {self._misses} health checks in a row')


def _check_reachable(workers: Sequence[RemoteWorker],
                     timeout_seconds: float) -> None:
  with concurrent.futures.ThreadPoolExecutor(len(workers)) as pool:
    ready = list(pool.map(lambda w: probe(w.address, timeout_seconds),
                          workers))
  missing = [str(w.address) for w, ok in zip(workers, ready) if not ok]
  if missing:
    raise WorkerUnavailableError(
        ', '.join(missing),
        f'did not accept a connection within {timeout_seconds:.0f} s')


def _returns_client_values(comp) -> bool:
  result = getattr(getattr(comp, 'type_signature', None), 'result', None)
  return result is not None and tff.types.contains(
      result, lambda t: isinstance(t, tff.FederatedType) and
      t.placement == tff.CLIENTS)


class MultiWorkerContext(tff.framework.SyncContext):
  """Runs computations on several workers (TFF's mergeable form).

  Computations with CLIENTS-placed results cannot be merged; invoking one
  raises `ValueError`. Run those with `map_clients`.
  """

  def __init__(self, workers: Sequence[RemoteWorker]):
    self.workers = list(workers)
    self._sync_contexts = [local.create_context(w) for w in self.workers]
    native = tff.backends.native
    self._mergeable = native.create_mergeable_comp_execution_context(
        [local.create_async_context(w) for w in self.workers])

  def invoke(self, comp, arg):
    if _returns_client_values(comp):
      raise ValueError(
          f'A computation of type {comp.type_signature} returns CLIENTS-placed'
          ' values, which TFF\'s mergeable execution context cannot split'
          f' across {len(self.workers)} workers. Run it with'
          ' tff_fair.runtime.remote.map_clients (one shard of clients per'
          ' worker; correct for per-client computations), or use one worker.')
    return self._mergeable.invoke(comp, arg)

  def map_clients(self, comp, server_arg: Any,
                  client_args: Sequence[Any]) -> list[Any]:
    """`comp(server_arg, client_args)` with clients sharded over workers."""
    if not client_args:
      return []
    shards = _contiguous_shards(len(client_args), len(self.workers))

    def run(shard_index: int) -> list[Any]:
      start, stop = shards[shard_index]
      with tff.framework.get_context_stack().install(
          self._sync_contexts[shard_index]):
        return list(comp(server_arg, list(client_args[start:stop])))

    with concurrent.futures.ThreadPoolExecutor(len(shards)) as pool:
      results = list(pool.map(run, range(len(shards))))
    return [value for shard in results for value in shard]


def _contiguous_shards(count: int, parts: int) -> list[tuple[int, int]]:
  """[start, stop) of up to `parts` non-empty, near-equal runs of `count`."""
  parts = min(parts, count)
  bounds = [round(i * count / parts) for i in range(parts + 1)]
  return list(zip(bounds[:-1], bounds[1:]))


def is_multi_worker() -> bool:
  """Whether the current context splits clients over several workers.

  Computations returning CLIENTS-placed values beside server ones cannot
  run there (see `MultiWorkerContext`).
  """
  return isinstance(tff.framework.get_context_stack().current,
                    MultiWorkerContext)


def worker_count() -> int:
  """How many workers the current context splits clients over (1 if none)."""
  if is_multi_worker():
    return len(tff.framework.get_context_stack().current.workers)
  return 1


def map_clients(comp: Callable[..., Any], server_arg: Any,
                client_args: Sequence[Any]) -> list[Any]:
  """Runs a per-client computation, sharding clients over workers if several.

  `comp(server_arg, client_args)` must compute each client's result from its
  own input and `server_arg` alone (a federated map, e.g. Ditto's
  `personalize` or local training); then splitting the clients is exact.

  Returns:
    The per-client results in the order of `client_args`.
  """
  if is_multi_worker():
    return tff.framework.get_context_stack().current.map_clients(
        comp, server_arg, client_args)
  return list(comp(server_arg, list(client_args)))


@contextlib.contextmanager
def remote_context(
    addresses: Sequence[WorkerAddress],
    connect_timeout_seconds: float = 20.0,
    monitor_interval_seconds: float = 4.0,
    reconnect_seconds: float = 10.0,
):
  """Installs a context on remote TFF workers as TFF's default.

  Args:
    addresses: One or more workers.
    connect_timeout_seconds: How long each worker may take to accept the
      first connection.
    monitor_interval_seconds: Spacing of health checks during the run.
    reconnect_seconds: How long a worker that dropped a call may take to
      answer again before it is given up.

  Yields:
    The `RemoteWorker`s.

  Raises:
    WorkerUnavailableError: If a worker is unreachable at start or is lost
      during the body (from the failing computation call).
  """
  workers = [RemoteWorker(a, reconnect_seconds) for a in addresses]
  monitor = None
  try:
    _check_reachable(workers, connect_timeout_seconds)
    logging.info('Connected to TFF worker(s) %s.',
                 ', '.join(str(a) for a in addresses))
    if len(workers) == 1:
      context = local.create_context(workers[0])
    else:
      context = MultiWorkerContext(workers)
    monitor = WorkerMonitor(workers, monitor_interval_seconds,
                            timeout_seconds=5.0)
    monitor.start()
    local.install_sigterm_handler()
    tff.framework.set_default_context(context)
    yield workers
  finally:
    if monitor is not None:
      monitor.stop()
    local.install_idle_context()
    for worker in workers:
      worker.close()
