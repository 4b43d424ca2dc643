"""A byte-for-byte picture of a file or folder, to assert nothing changed.

Plain Python: fast tests import it without TensorFlow.
"""

import os
from typing import Optional, Union

Snapshot = Union[bytes, dict[str, Union[bytes, str]]]


def snapshot(path: str) -> Optional[Snapshot]:
  """Every file's bytes and every folder under `path` (None if absent)."""
  if not os.path.exists(path):
    return None
  if not os.path.isdir(path):
    with open(path, 'rb') as f:
      return f.read()
  tree = {}
  for root, dirs, names in os.walk(path):
    for name in dirs:
      tree[os.path.relpath(os.path.join(root, name), path)] = 'dir'
    for name in names:
      with open(os.path.join(root, name), 'rb') as f:
        tree[os.path.relpath(os.path.join(root, name), path)] = f.read()
  return tree
