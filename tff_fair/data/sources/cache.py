"""Decoded arrays cached on disk, so a slow decode runs once per file.

A cache file is an .npz named after the data set, a format version and the
size and modification time of the file it was decoded from: a changed file
gets a new entry. The cache is only a speed-up: an unreadable entry is
ignored (and decoded again), a failed write only logged.

The directory is `cache_dir`, else `TFF_FAIR_CACHE_DIR`, else
`~/.cache/tff_fair`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import os
import zlib

from absl import logging
import numpy as np

from tff_fair import files

CACHE_DIR_ENV = 'TFF_FAIR_CACHE_DIR'
DEFAULT_CACHE_DIR = os.path.join('~', '.cache', 'tff_fair')


def resolve_cache_dir(cache_dir: str | None) -> str:
  """Returns `cache_dir`, else `$TFF_FAIR_CACHE_DIR`, else ~/.cache/tff_fair."""
  root = cache_dir or os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR
  return os.path.expanduser(root)


def cache_path(cache_dir: str | None, name: str, version: int,
               decoded_from: str) -> str:
  """The cache file of `name`'s arrays decoded from the file `decoded_from`.

  Args:
    cache_dir: See `resolve_cache_dir`.
    name: The data set's name.
    version: The format version of the cached arrays (bump it when they
      change).
    decoded_from: The file the arrays are decoded from.
  """
  stat = os.stat(decoded_from)
  # Size + mtime identify the file cheaply; the version guards format changes.
  return os.path.join(
      resolve_cache_dir(cache_dir),
      f'{name}_v{version}_{stat.st_size}_{stat.st_mtime_ns}.npz',
  )


def read(path: str, keys: Sequence[str]) -> dict[str, np.ndarray] | None:
  """The arrays `keys` cached at `path`, or None if absent or unreadable."""
  if not os.path.isfile(path):
    return None
  try:
    with np.load(path) as cached:
      return {k: cached[k] for k in keys}
  except (OSError, ValueError, KeyError, zlib.error) as e:
    # A broken cache is only a lost speed-up: decode again and overwrite it.
    logging.warning('Ignoring unreadable cache %s: %s', path, e)
    return None


def write(path: str, arrays: Mapping[str, np.ndarray]) -> None:
  """Caches `arrays` at `path` (atomically); a failure is only logged."""
  try:
    files.write_atomically(path, lambda f: np.savez(f, **arrays), binary=True)
  except OSError as e:
    logging.warning('Could not write cache %s: %s', path, e)
