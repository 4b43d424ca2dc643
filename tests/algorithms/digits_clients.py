"""Clients of chosen sizes on the bundled digits, for the algorithm tests."""

import collections
from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import training_loop
from tff_fair.data.sources import digits

_DIGITS = digits.load_digits()


def sgd(lr: float = 0.1) -> tff.learning.optimizers.Optimizer:
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


class Clients:
  """Client i holds the next `sizes[i]` digits, in the data set's order."""

  def __init__(self, sizes: Sequence[int],
               model_fn: Optional[Callable[[], tff.learning.models.
                                           VariableModel]] = None):
    self.sizes = tuple(sizes)
    self._model_fn = model_fn

  def dataset(self, client: int, batch: int = 20) -> tf.data.Dataset:
    """Client `client`'s batches."""
    start = sum(self.sizes[:client])
    rows = slice(start, start + self.sizes[client])
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=_DIGITS.x[rows], y=_DIGITS.y[rows])).batch(batch)

  def local_update(self, start, client: int,
                   lr: float = 0.1) -> list[np.ndarray]:
    """Its update (`start - trained`), trained eagerly with SGD."""
    trained = training_loop.build_training_loop(self._model_fn(), sgd(lr))(
        start, self.dataset(client))
    return [np.asarray(s) - t.numpy()
            for s, t in zip(start.trainable, trained['weights'].trainable)]
