"""Per-client state of any recipe, kept on disk between rounds.

`ClientModelStore` keeps one model, or one part of a model, per client
(Ditto's personal models, FedRep's heads: `tff_fair.models.parts`) with a
small JSON metadata record each (e.g. Ditto's lambda), versioned in step
with the
server checkpoints (`tff_fair.state.client_store`): the driver opens the
version of the checkpoint it resumes from, commits each round's writes
before that round's checkpoint and prunes after it. `RoundLog` is a
per-round CSV of per-client records with the same resume rule.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
import csv
import os
from typing import Any, Optional

import numpy as np
import tensorflow_federated as tff

from tff_fair import files
from tff_fair.models import parts
from tff_fair.state import client_store


def _to_arrays(weights: tff.learning.models.ModelWeights) -> list[np.ndarray]:
  return [np.asarray(w) for w in (*weights.trainable, *weights.non_trainable)]


class ClientModelStore:
  """Disk-backed per-client models (or parts) and metadata, by round.

  Attributes:
    root: Directory of the store.
    part: What a client's entry holds of the model (`parts.WHOLE`: all).
  """

  def __init__(self, root: str, template: tff.learning.models.ModelWeights,
               part: parts.ModelPart = parts.WHOLE):
    """Creates or opens the store under `root`.

    Args:
      root: Directory of the store.
      template: Any weights of the whole model (shapes and dtypes).
      part: What each client keeps of the model.
    """
    self.root = root
    self.part = part
    template = part.extract(template)
    self._num_trainable = len(template.trainable)
    self._store = client_store.ClientStateStore(root, _to_arrays(template))
    self._updated: list[str] = []

  def open(self, round_num: int) -> None:
    """Makes the state as of the checkpoint of `round_num` current."""
    self._store.open(round_num)

  def committed_versions(self) -> list[int]:
    """The rounds whose state can be opened."""
    return client_store.committed_versions(self.root)

  def weights(self, client_id: str
              ) -> Optional[tff.learning.models.ModelWeights]:
    """The client's entry (its model or part), or None if it has none."""
    arrays = self._store.read(client_id)
    if arrays is None:
      return None
    return tff.learning.models.ModelWeights(
        trainable=arrays[:self._num_trainable],
        non_trainable=arrays[self._num_trainable:])

  def metadata(self, client_id: str) -> Optional[dict[str, Any]]:
    """The metadata written with the client's model (None: no model)."""
    return self._store.metadata(client_id)

  def write(self, client_id: str, weights: tff.learning.models.ModelWeights,
            round_num: int,
            metadata: Optional[Mapping[str, Any]] = None) -> None:
    """Stores the client's entry of `round_num` (pending `commit`)."""
    self._store.write(client_id, _to_arrays(weights), round_num,
                      metadata=dict(metadata or {}))
    self._updated.append(client_id)

  def trained_client_ids(self) -> list[str]:
    """Clients with a model in the open (committed) version."""
    return self._store.client_ids()

  def commit(self, round_num: int) -> None:
    """Writes the round's manifest (call before the server checkpoint)."""
    self._store.commit(round_num)

  def prune(self, round_num: int, keep: Iterable[int] = ()) -> None:
    """Drops what no kept checkpoint needs (call after the server checkpoint).

    Args:
      round_num: The round just checkpointed.
      keep: The rounds whose server checkpoints are kept: their models stay,
        so a resume can fall back to any of them.
    """
    self._store.prune(round_num, self._updated, keep=keep)
    self._updated = []

  def lookup(
      self, global_weights: tff.learning.models.ModelWeights
  ) -> Callable[[str], tff.learning.models.ModelWeights]:
    """For evaluation: a client's whole model, else the global model.

    A client's entry joins the global model (`parts.ModelPart.compose`:
    FedRep's head on the global body). Only for reports that say so: a
    client never trained has no entry of its own, and its global model
    must not be counted as one.
    """
    def weights_for(client_id: str) -> tff.learning.models.ModelWeights:
      entry = self.weights(client_id)
      return (global_weights if entry is None
              else self.part.compose(global_weights, entry))

    return weights_for


class RoundLog:
  """A CSV of per-client records, appended round by round.

  Rows are appended each round before the round's checkpoint is saved;
  `open(r)` (on resume from the checkpoint of round r) drops the rows of
  later rounds, which run again. The first column is 'round'.
  """

  def __init__(self, path: str, fields: Sequence[str]):
    if not fields or fields[0] != 'round':
      raise ValueError(f"A RoundLog's first field is 'round', got {fields}.")
    self._path = path
    self._fields = tuple(fields)

  def open(self, round_num: int) -> None:
    """Keeps the rows of rounds <= `round_num` (creates the file if new)."""
    rows = self.read()
    kept = [row for row in rows if int(row['round']) <= round_num]
    if os.path.exists(self._path) and len(kept) == len(rows):
      return

    def write(f):
      writer = csv.DictWriter(f, fieldnames=self._fields)
      writer.writeheader()
      writer.writerows(kept)

    files.write_atomically(self._path, write)

  def append(self, records: Sequence[Mapping[str, Any]]) -> None:
    """Appends one round's rows."""
    with open(self._path, 'a', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=self._fields)
      writer.writerows(records)
      f.flush()
      os.fsync(f.fileno())

  def read(self) -> list[dict[str, str]]:
    """All rows, as strings (empty when the file does not exist)."""
    if not os.path.exists(self._path):
      return []
    with open(self._path, newline='') as f:
      return list(csv.DictReader(f))
