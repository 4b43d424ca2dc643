"""Disk-backed, versioned run state of one JSON value (e.g. contributions).

What a recipe keeps between rounds besides per-client models: a small JSON
value (a contribution tracker's state, each client's width), versioned by
round in step with the server checkpoints, with the protocol of
`client_store.ClientStateStore`: the driver opens the version of the
checkpoint it resumes from, commits each round's value before that round's
checkpoint, and prunes after it, keeping the versions of the kept
checkpoints. A resumed run therefore reads exactly the value an
uninterrupted run had after that round.

Layout under `root` (that of the client store's manifests, so
`client_store.committed_versions` lists both):

    manifests/v<round>.json    {"value": ...} after that round

Plain Python: no numpy, no TensorFlow.
"""

from collections.abc import Iterable
import json
import os
from typing import Any, Optional

from tff_fair import files
from tff_fair.state import client_store


class RoundStateStore:
  """One JSON value per round, committed with the checkpoints.

  Attributes:
    root: Directory of the store.
    value: The current value: the one opened, or staged this round.
  """

  def __init__(self, root: str, initial: Any = None):
    """Creates or opens the store under `root`.

    Args:
      root: Directory of the store.
      initial: The value before any round (round 0).
    """
    self.root = root
    self._initial = initial
    self.value = initial

  def _path(self, version: int) -> str:
    return os.path.join(self.root, 'manifests', f'v{version}.json')

  def committed_versions(self) -> list[int]:
    """The rounds whose value can be opened."""
    return client_store.committed_versions(self.root)

  def open(self, version: int) -> Optional[Any]:
    """Makes the value after round `version` current, and returns it.

    Round 0 without a committed value is the initial value.

    Raises:
      client_store.ClientStateError: If the value of a round > 0 is missing
        or damaged (naming the file).
    """
    path = self._path(version)
    if version == 0 and not os.path.exists(path):
      self.value = self._initial
      return self.value
    try:
      with open(path) as f:
        self.value = json.load(f)['value']
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise client_store.ClientStateError(
          f'The run state {path} of round {version} is missing or damaged'
          f' ({type(e).__name__}: {e}); resume from another checkpoint'
          ' (--checkpoint_fallback) or pass --start_over.') from e
    return self.value

  def stage(self, value: Any) -> None:
    """Sets this round's value (written by `commit`)."""
    json.dumps(value)  # Refuses a value JSON cannot hold, now.
    self.value = value

  def commit(self, version: int) -> None:
    """Writes the current value as round `version`'s (before the checkpoint)."""
    files.write_atomically(
        self._path(version),
        lambda f: json.dump({'value': self.value}, f, sort_keys=True))

  def prune(self, version: int, keep: Iterable[int] = ()) -> None:
    """Drops the values no kept checkpoint needs (after the checkpoint)."""
    kept = set(keep) | {version}
    for old in self.committed_versions():
      if old not in kept:
        os.remove(self._path(old))
