"""Atomic writes of a run's small output files (config, tables, summaries).

A file is written to a temporary name in the same folder and renamed over
the target, so a kill never leaves a half-written file behind.
"""

from collections.abc import Callable
import os
import tempfile
from typing import IO


def write_atomically(path: str, write: Callable[[IO[str]], None]) -> None:
  """Calls `write(f)` on a temporary text file, then renames it to `path`."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or '.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'w', newline='') as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
