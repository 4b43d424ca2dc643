"""Personal models of Ditto-style algorithms, kept on disk between rounds.

Wraps the numpy `ClientStateStore` with what the driver needs: model weights
in and out, each client's lambda (fixed, from a mapping, or chosen once from a
grid and then remembered with the model), and a weights lookup for
evaluation that falls back to the global model for clients never trained.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Optional, Union

import numpy as np
import tensorflow_federated as tff

from tff_fair.state import client_store

ModelWeights = tff.learning.models.ModelWeights
LambdaPolicy = Union[float, Mapping[str, float], Sequence[float]]


def _to_arrays(weights: ModelWeights) -> list[np.ndarray]:
  return [np.asarray(w) for w in (*weights.trainable, *weights.non_trainable)]


class PersonalModels:
  """Disk-backed personal models and lambdas of all clients.

  Attributes:
    lambda_grid: The grid a new client's lambda is chosen from, or () when
      lambdas are given.
  """

  def __init__(self, root: str, template: ModelWeights,
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

  def weights(self, client_id: str) -> Optional[ModelWeights]:
    """The client's personal model, or None if it never trained."""
    arrays = self._store.read(client_id)
    if arrays is None:
      return None
    return ModelWeights(trainable=arrays[:self._num_trainable],
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

  def write(self, client_id: str, weights: ModelWeights, round_num: int,
            lam: float) -> None:
    self._store.write(client_id, _to_arrays(weights), round_num,
                      metadata={'lam': float(lam)})
    self._updated.append(client_id)

  def commit(self, round_num: int) -> None:
    """Writes the round's manifest (call before the server checkpoint)."""
    self._store.commit(round_num)

  def prune(self, round_num: int) -> None:
    """Drops superseded files (call after the server checkpoint)."""
    self._store.prune(round_num, self._updated)
    self._updated = []

  def lookup(
      self, global_weights: ModelWeights
  ) -> Callable[[str], ModelWeights]:
    """For evaluation: a client's personal model, else the global model."""
    def weights_for(client_id: str) -> ModelWeights:
      weights = self.weights(client_id)
      return global_weights if weights is None else weights

    return weights_for
