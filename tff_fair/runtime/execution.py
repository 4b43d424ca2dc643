"""Chooses the execution context of a run: local worker or remote workers."""

import contextlib
from typing import Iterator

from tff_fair.runtime import local
from tff_fair.runtime import remote

EXECUTORS = ('local', 'remote')


@contextlib.contextmanager
def execution_context(executor: str = 'local', workers: str = '',
                      max_concurrent_computation_calls: int = -1
                      ) -> Iterator[None]:
  """Installs the context a program asked for, for the `with` body.

  Args:
    executor: 'local' (a worker process of our own) or 'remote' (the TFF
      workers in `workers`).
    workers: `host:port,...` of running TFF workers (executor 'remote').
    max_concurrent_computation_calls: Local worker concurrency (remote
      workers set theirs when started).

  Raises:
    remote.ExecutorConfigError: On a bad executor/workers combination,
      before connecting.
    remote.WorkerUnavailableError: If a remote worker is unreachable.
  """
  if executor not in EXECUTORS:
    raise remote.ExecutorConfigError(
        f'--executor={executor!r}; choose one of {EXECUTORS}.')
  if executor == 'local':
    if workers:
      raise remote.ExecutorConfigError(
          '--workers needs --executor=remote (with --executor=local a worker'
          ' of our own is started).')
    with local.local_context(max_concurrent_computation_calls):
      yield
    return
  if not workers:
    raise remote.ExecutorConfigError(
        '--executor=remote needs --workers=host:port,... of running TFF'
        ' workers (python -m programs.worker).')
  if max_concurrent_computation_calls != -1:
    raise remote.ExecutorConfigError(
        f'--max_concurrent_computation_calls={max_concurrent_computation_calls}'
        ' would be ignored: it sets the local worker of --executor=local;'
        ' a remote worker takes it when started (python -m programs.worker'
        ' --max_concurrent_computation_calls=N). Drop it here.')
  with remote.remote_context(remote.parse_workers(workers)):
    yield
