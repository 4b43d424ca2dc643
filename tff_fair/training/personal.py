"""Personal models of Ditto-style algorithms, kept on disk between rounds.

Wraps the numpy `ClientStateStore` with what the driver needs: model weights
in and out, each client's lambda (fixed, from a mapping, or chosen from a
grid and remembered with the model together with the round it was chosen
in, so the driver can choose it again every k rounds), and weights lookups
for evaluation.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
import csv
import os
from typing import Any, Optional, Union

import numpy as np
import tensorflow_federated as tff

from tff_fair import files
from tff_fair.state import client_store

LambdaPolicy = Union[float, Mapping[str, float], Sequence[float]]


def _to_arrays(weights: tff.learning.models.ModelWeights) -> list[np.ndarray]:
  return [np.asarray(w) for w in (*weights.trainable, *weights.non_trainable)]


class PersonalModelStore:
  """Disk-backed personal models and lambdas of all clients.

  The driver's store (versioned with the checkpoints);
  `tff_fair.algorithms.ditto.PersonalModels` keeps personal models in
  memory for a loop of your own.

  Attributes:
    lambda_grid: The grid a new client's lambda is chosen from, or () when
      lambdas are given.
  """

  def __init__(self, root: str, template: tff.learning.models.ModelWeights,
               lambdas: LambdaPolicy):
    """Creates or opens the personal models under `root`.

    Args:
      root: Directory of the store.
      template: Any weights of the model (shapes and dtypes).
      lambdas: One lambda for all clients, a mapping client -> lambda, or a
        sequence (a grid to choose from per client by validation loss).
    """
    self._num_trainable = len(template.trainable)
    self._store = client_store.ClientStateStore(root, _to_arrays(template))
    self._fixed: Optional[float] = None
    self._mapping: Mapping[str, float] = {}
    self.lambda_grid: tuple[float, ...] = ()
    if isinstance(lambdas, Mapping):
      self._mapping = dict(lambdas)
    elif isinstance(lambdas, (int, float)):
      self._fixed = float(lambdas)
    else:
      self.lambda_grid = tuple(float(v) for v in lambdas)
    self._updated: list[str] = []

  def open(self, round_num: int) -> None:
    """Makes the state as of the checkpoint of `round_num` current."""
    self._store.open(round_num)

  def weights(
      self, client_id: str) -> Optional[tff.learning.models.ModelWeights]:
    """The client's personal model, or None if it never trained."""
    arrays = self._store.read(client_id)
    if arrays is None:
      return None
    return tff.learning.models.ModelWeights(
        trainable=arrays[:self._num_trainable],
        non_trainable=arrays[self._num_trainable:])

  def lam(self, client_id: str) -> Optional[float]:
    """The client's lambda; None when it is still to be chosen from the grid.

    Raises:
      KeyError: For a mapping that lacks the client.
    """
    if self._fixed is not None:
      return self._fixed
    if self._mapping:
      if client_id not in self._mapping:
        raise KeyError(f'No Ditto lambda for client {client_id!r}.')
      return self._mapping[client_id]
    metadata = self._store.metadata(client_id)
    return None if metadata is None else float(metadata['lam'])

  def lambda_due(self, client_id: str, round_num: int, every: int) -> bool:
    """Whether the client's lambda is to be chosen from the grid this round.

    Args:
      client_id: The client.
      round_num: The round about to train.
      every: Choose again when the stored choice is at least this many
        rounds old; 0 chooses once, the first time the client trains.

    Returns:
      False without a grid; True for a client without a lambda yet.
    """
    if not self.lambda_grid:
      return False
    metadata = self._store.metadata(client_id)
    if metadata is None:
      return True
    if every <= 0:
      return False
    # Stores written before lambdas were re-chosen lack the round: the
    # choice then dates from the client's first round, at the latest round 0.
    chosen = int(metadata.get('lam_round', 0))
    return round_num - chosen >= every

  def write(self, client_id: str, weights: tff.learning.models.ModelWeights,
            round_num: int, lam: float,
            lam_round: Optional[int] = None) -> None:
    """Stores the client's model of `round_num` (pending `commit`).

    Args:
      client_id: The client.
      weights: Its personal model after the round.
      round_num: The round that trained it.
      lam: The lambda it trained with.
      lam_round: The round `lam` was chosen in (grid policy); default: the
        choice stored before, else `round_num`.
    """
    if lam_round is None:
      metadata = self._store.metadata(client_id)
      lam_round = (round_num if metadata is None
                   else int(metadata.get('lam_round', 0)))
    self._store.write(client_id, _to_arrays(weights), round_num,
                      metadata={'lam': float(lam), 'lam_round': lam_round})
    self._updated.append(client_id)

  def trained_client_ids(self) -> list[str]:
    """Clients with a personal model in the open (committed) version."""
    return self._store.client_ids()

  def commit(self, round_num: int) -> None:
    """Writes the round's manifest (call before the server checkpoint)."""
    self._store.commit(round_num)

  def prune(self, round_num: int, keep: Iterable[int] = ()) -> None:
    """Drops what no kept checkpoint needs (call after the server checkpoint).

    Args:
      round_num: The round just checkpointed.
      keep: The rounds whose server checkpoints are kept: their personal
        models stay, so a resume can fall back to any of them.
    """
    self._store.prune(round_num, self._updated, keep=keep)
    self._updated = []

  def lookup(
      self, global_weights: tff.learning.models.ModelWeights
  ) -> Callable[[str], tff.learning.models.ModelWeights]:
    """For evaluation: a client's personal model, else the global model.

    Only for reports that say so: a client never trained has no personal
    model, and its global model must not be counted as one.
    """
    def weights_for(client_id: str) -> tff.learning.models.ModelWeights:
      weights = self.weights(client_id)
      return global_weights if weights is None else weights

    return weights_for


ROUND_LOG_FIELDS = (
    'round', 'client', 'malicious', 'lambda', 'lambda_chosen',
    'train_loss_during', 'train_loss', 'train_accuracy', 'validation_loss',
    'validation_accuracy')


class RoundLog:
  """`personal_rounds.csv`: each sampled client's personal step, per round.

  Columns (`ROUND_LOG_FIELDS`): the round and client; whether the client
  attacks; the lambda it trained with and whether that lambda was chosen
  from the grid this round; `train_loss_during`, the mean training loss
  over the round's batches (the weights moving as they are measured); and
  the loss and accuracy of the model the round ends with on the client's
  training and validation data (empty without validation examples). A
  personal model that collapses shows as a low `train_accuracy` even when
  `train_loss_during` is low.

  Rows are appended each round before the round's checkpoint is saved;
  `open(r)` (on resume from the checkpoint of round r) drops the rows of
  later rounds, which run again.
  """

  def __init__(self, path: str):
    self._path = path

  @property
  def path(self) -> str:
    return self._path

  def open(self, round_num: int) -> None:
    """Keeps the rows of rounds <= `round_num` (creates the file if new)."""
    rows = self.read()
    kept = [row for row in rows if int(row['round']) <= round_num]
    if os.path.exists(self._path) and len(kept) == len(rows):
      return

    def write(f):
      writer = csv.DictWriter(f, fieldnames=ROUND_LOG_FIELDS)
      writer.writeheader()
      writer.writerows(kept)

    files.write_atomically(self._path, write)

  def append(self, records: Sequence[Mapping[str, Any]]) -> None:
    """Appends one round's rows."""
    with open(self._path, 'a', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=ROUND_LOG_FIELDS)
      writer.writerows(records)
      f.flush()
      os.fsync(f.fileno())

  def read(self) -> list[dict[str, str]]:
    """All rows, as strings (empty when the file does not exist)."""
    if not os.path.exists(self._path):
      return []
    with open(self._path, newline='') as f:
      return list(csv.DictReader(f))
