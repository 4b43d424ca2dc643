"""A byte-for-byte picture of a file or folder, to assert nothing changed.

Plain Python: fast tests import it without TensorFlow.
"""

import hashlib
import os
from typing import Optional, Union

# File contents as SHA-256 digests: equal digests, equal bytes; and a failed
# comparison prints names and digests, not megabytes of checkpoint.
Snapshot = Union[str, dict[str, str]]


def _digest(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def snapshot(path: str) -> Optional[Snapshot]:
  """Every file's digest and every folder under `path` (None if absent)."""
  if not os.path.exists(path):
    return None
  if not os.path.isdir(path):
    return _digest(path)
  tree = {}
  for root, dirs, names in os.walk(path):
    for name in dirs:
      tree[os.path.relpath(os.path.join(root, name), path)] = 'dir'
    for name in names:
      tree[os.path.relpath(os.path.join(root, name), path)] = _digest(
          os.path.join(root, name))
  return tree
