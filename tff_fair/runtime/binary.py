"""Where TFF's C++ worker binary is, found without importing TFF."""

import importlib.util
import os


def worker_binary_path() -> str:
  """Path of `worker_binary` in the installed tensorflow-federated wheel.

  Raises:
    RuntimeError: If tensorflow-federated or its worker binary is missing.
  """
  spec = importlib.util.find_spec('tensorflow_federated')
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError('tensorflow-federated is not installed; install'
                       ' requirements.txt (make setup).')
  path = os.path.join(spec.submodule_search_locations[0], 'data',
                      'worker_binary')
  if not os.path.isfile(path):
    raise RuntimeError(
        f'TFF worker binary not found at {path}. Reinstall'
        ' tensorflow-federated==0.87.0 from requirements.txt.')
  return path
