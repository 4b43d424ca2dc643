"""Atomic file writes: a reader never sees a half-written file.

A file is written to a temporary name in the same folder, flushed to disk
and renamed over the target, so a kill (or a crash of the machine) leaves
either the old file or the new one. One helper serves every writer: a run's
small text outputs (config, tables, summaries), the per-client state store's
arrays and manifests, and the data loaders' caches.

Plain Python, so every layer may use it.
"""

from collections.abc import Callable
import os
import tempfile
from typing import IO, Any


def write_atomically(path: str, write: Callable[[IO[Any]], None], *,
                     binary: bool = False) -> None:
  """Calls `write(f)` on a temporary file, then renames it to `path`.

  Args:
    path: The file to write or replace; its folder is created if missing.
    write: Writes the contents to the open file it is given.
    binary: Open the file in binary mode (bytes, `np.savez`) instead of
      text mode (no newline translation, as `csv` wants).
  """
  directory = os.path.dirname(path) or '.'
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, suffix='.tmp')
  try:
    with (os.fdopen(fd, 'wb') if binary
          else os.fdopen(fd, 'w', newline='')) as f:
      write(f)
      f.flush()
      # On disk before the rename: after a crash the name never points at
      # an empty file.
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
