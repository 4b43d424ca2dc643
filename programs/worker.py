r"""Starts TFF's C++ worker binary, for `--executor=remote` runs.

Run one on each worker host (same tensorflow-federated version as the
driver; `make setup` there), then point the driver at them:

  host-a$ python -m programs.worker --port=8000
  host-b$ python -m programs.worker --port=8000
  driver$ python -m programs.train ... --executor=remote \
      --workers=host-a:8000,host-b:8000

The worker serves plain, unauthenticated gRPC: anyone who can reach the port
can run computations on it and read what it holds. Keep workers on a private
network (or behind an SSH tunnel / VPN), never on a public address.

The wheel's worker is built without CUDA; on a GPU host pass a worker built
from TFF's source with CUDA as --worker_binary.

The launcher replaces itself with the binary (exec), so signals (Ctrl-C,
SIGTERM from a supervisor) reach the worker directly and nothing is left
behind.
"""

import errno
import os
import socket
import sys

from absl import app
from absl import flags
from absl import logging

from tff_fair.runtime import binary
from tff_fair.runtime import quiet_startup

_PORT = flags.DEFINE_integer('port', None, 'TCP port to serve on (all'
                             ' interfaces).', lower_bound=1, upper_bound=65535)
_MAX_CALLS = flags.DEFINE_integer(
    'max_concurrent_computation_calls', -1,
    'Computations the worker runs at once, e.g. clients trained in parallel'
    ' (-1: no limit). Lower it to bound memory with large models.')
_BINARY = flags.DEFINE_string(
    'worker_binary', '',
    'A TFF worker binary to run instead of the wheel\'s CPU-only one, e.g.'
    ' one built from source with CUDA for GPU hosts (same TFF version).')
flags.mark_flag_as_required('port')


def _check_port_free(port: int) -> None:
  with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
    # Connections of a previous worker in TIME_WAIT must not count (the
    # worker itself binds with SO_REUSEADDR); a live listener still does.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind(('::', port))
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        raise app.UsageError(
            f'Port {port} is in use (another worker?); choose another'
            ' --port.') from e
      raise


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  _check_port_free(_PORT.value)
  try:
    path = _BINARY.value or binary.worker_binary_path()
  except RuntimeError as e:
    logging.error('%s', e)
    sys.exit(2)
  if not os.access(path, os.X_OK):
    logging.error('--worker_binary=%s is not an executable file.', path)
    sys.exit(2)
  logging.warning(
      'Serving TFF computations on port %d, unencrypted and without'
      ' authentication: keep this port on a private network.', _PORT.value)
  # The worker inherits our environment: no INFO lines from its C++ runtime.
  quiet_startup.quiet_environment()
  sys.stdout.flush()
  sys.stderr.flush()
  os.execv(path, [path, f'--port={_PORT.value}',
                  f'--max_concurrent_computation_calls={_MAX_CALLS.value}'])


if __name__ == '__main__':
  app.run(main)
