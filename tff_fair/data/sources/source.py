"""The `Source` type: every example of one data set, pooled in memory.

A `Source` holds the source's own train split first and its test split after
it, with a boolean `is_test` flag per example.

Conventions shared by all sources:

* Images are float32 in [0, 1] with a channel axis: (N, 28, 28, 1) for
  fashion_mnist, mnist and femnist (ink high), (N, 32, 32, 3) for cifar10,
  (N, 8, 8, 1) for digits (raw 0..16 values divided by 16).
* Labels are int32 everywhere (`LABEL_DTYPE`): class ids of shape (N,) for
  classification, next-character ids of shape (N, sequence_length) for
  Shakespeare. int32 is what Keras sparse losses and TFF specs accept without
  casts and is wide enough for every vocabulary here.
* Token inputs (Shakespeare, SST-2) are int32 ids with 0 as padding.
* `max_examples` keeps a deterministic, stratified subset (`subsample`): the
  first k examples of every stratum taken round-robin, where a stratum is
  (split, group) for sources with natural groups and (split, class)
  otherwise. It exists so tests can load a few hundred examples in well
  under a second.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import types
from typing import Any

import numpy as np

from tff_fair import errors

LABEL_DTYPE = np.int32
TOKEN_DTYPE = np.int32

# The name of a Source built from your own arrays unless you give one.
OWN_SOURCE_NAME = 'own_data'


class DataError(errors.UserError, ValueError):
  """A data file is missing, malformed or a request cannot be satisfied."""


@dataclasses.dataclass(frozen=True, eq=False)
class Source:
  """All examples of one data set, pooled (own train split first, then test).

  Your own data is `Source(x, y, num_classes, is_test)` (optionally with a
  `name`); the loaders build theirs the same way. Float inputs become
  float32, integer inputs (token ids) and labels int32: the dtypes of the
  models' input specs.

  Attributes:
    x: Inputs, first axis = example.
    y: int32 labels: (N,) class ids for classification, (N, seq_len)
      next-token targets for Shakespeare.
    num_classes: Number of classes; vocabulary size for Shakespeare.
    is_test: bool (N,), True for examples of the source's own test split.
    name: One of `registry.SOURCE_NAMES` for the loaders' data sets (it
      picks their default model and settings); any other name for your own
      data.
    groups: int (N,) natural client index (FEMNIST writer, Shakespeare role)
      into `group_names`, or None when the source has no natural clients.
    group_names: Name of each group, or None.
    metadata: Read-only extra facts, e.g. `class_names`, `num_tokens` (SST-2
      vocabulary size) or the Shakespeare special ids.
  """
  x: np.ndarray
  y: np.ndarray
  num_classes: int
  is_test: np.ndarray
  # After the arrays, so own data needs no name: Source(x, y, k, is_test).
  name: str = OWN_SOURCE_NAME
  groups: np.ndarray | None = None
  group_names: tuple[str, ...] | None = None
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    n = len(self.x)
    # Catch loader bugs early: every array must describe the same examples.
    if len(self.y) != n or len(self.is_test) != n:
      raise DataError(
          f'Source {self.name!r}: x has {n} examples but y has {len(self.y)}'
          f' and is_test {len(self.is_test)}; all must have the same length.'
      )
    if self.is_test.dtype != np.bool_:
      raise DataError(
          f'Source {self.name!r}: is_test must be bool, got'
          f' {self.is_test.dtype}; pass a boolean mask.'
      )
    if (self.groups is None) != (self.group_names is None):
      raise DataError(
          f'Source {self.name!r}: groups and group_names must both be set or'
          ' both be None.'
      )
    if self.groups is not None:
      if len(self.groups) != n:
        raise DataError(
            f'Source {self.name!r}: groups has {len(self.groups)} entries for'
            f' {n} examples; give one group index per example.'
        )
      if n and (
          self.groups.min() < 0 or self.groups.max() >= len(self.group_names)
      ):
        raise DataError(
            f'Source {self.name!r}: group indices must lie in'
            f' [0, {len(self.group_names)}); fix the group index array.'
        )
    if self.y.dtype.kind not in 'iu':
      raise DataError(
          f'Source {self.name!r}: y must hold integer class ids, got'
          f' {self.y.dtype}; convert it, e.g. y.astype(np.int32).'
      )
    if self.y.ndim == 1 and n and (
        self.y.min() < 0 or self.y.max() >= self.num_classes
    ):
      raise DataError(
          f'Source {self.name!r}: labels must lie in [0, {self.num_classes}),'
          f' got [{self.y.min()}, {self.y.max()}]; fix num_classes or y.'
      )
    # Own arrays often come as numpy's int64 / float64; the models' TFF
    # input specs take int32 labels and float32 inputs or int32 token ids.
    x_dtype = np.float32 if self.x.dtype.kind == 'f' else TOKEN_DTYPE
    if self.x.dtype.kind in 'fiu' and self.x.dtype != x_dtype:
      object.__setattr__(self, 'x', self.x.astype(x_dtype))
    if self.y.dtype != LABEL_DTYPE:
      object.__setattr__(self, 'y', self.y.astype(LABEL_DTYPE))
    # A MappingProxy keeps the metadata of a frozen Source from being edited.
    object.__setattr__(
        self, 'metadata', types.MappingProxyType(dict(self.metadata))
    )

  @property
  def num_examples(self) -> int:
    return len(self.x)

  @property
  def has_class_labels(self) -> bool:
    """True when `y` holds one class id per example (not a sequence)."""
    return self.y.ndim == 1

  def take(self, indices: np.ndarray) -> Source:
    """Returns a new Source with only the examples at `indices`, in order.

    Args:
      indices: Integer positions into this source.
    """
    indices = np.asarray(indices, dtype=np.int64)
    return dataclasses.replace(
        self,
        x=self.x[indices],
        y=self.y[indices],
        is_test=self.is_test[indices],
        groups=None if self.groups is None else self.groups[indices],
    )



def from_train_test(
    name: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    num_classes: int,
    **kwargs,
) -> Source:
  """Builds a Source from (x, y) train and test parts, train first.

  Args:
    name: The source's name.
    train: (x, y) of the train split.
    test: (x, y) of the test split.
    num_classes: Number of classes.
    **kwargs: Further `Source` fields (`groups`, `metadata`, ...).
  """
  x = np.concatenate([train[0], test[0]])
  y = np.concatenate([train[1], test[1]]).astype(LABEL_DTYPE)
  is_test = np.concatenate(
      [np.zeros(len(train[0]), bool), np.ones(len(test[0]), bool)]
  )
  return Source(
      name=name, x=x, y=y, num_classes=num_classes, is_test=is_test, **kwargs
  )


def to_float_images(images: np.ndarray, max_value: float) -> np.ndarray:
  """Scales integer images to float32 [0, 1] and adds a channel axis if 3-D."""
  x = images.astype(np.float32) / np.float32(max_value)
  return x[..., np.newaxis] if x.ndim == 3 else x


def stratified_first_k(strata: np.ndarray, k: int) -> np.ndarray:
  """Picks k positions, round-robin over strata, first ones of each stratum.

  Deterministic and cheap: no random numbers, so a test subset is the same
  on every machine. Strata are served in order of their smallest key.

  Args:
    strata: Integer stratum key per example, shape (N,).
    k: Number of positions to keep (k >= N keeps everything).

  Returns:
    Sorted int64 positions.
  """
  strata = np.asarray(strata)
  n = len(strata)
  if k >= n:
    return np.arange(n, dtype=np.int64)
  _, inverse = np.unique(strata, return_inverse=True)
  order = np.argsort(inverse, kind='stable')
  counts = np.bincount(inverse)
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  rank = np.empty(n, dtype=np.int64)
  rank[order] = np.arange(n) - np.repeat(starts, counts)
  # Primary key rank, secondary key stratum: everyone's 1st, then 2nd, ...
  chosen = np.lexsort((inverse, rank))[:k]
  return np.sort(chosen).astype(np.int64)


def check_max_examples(max_examples: int | None) -> None:
  """Raises `DataError` unless `max_examples` is None or a positive int."""
  if max_examples is not None and (
      isinstance(max_examples, bool)
      or not isinstance(max_examples, (int, np.integer))
      or max_examples < 1
  ):
    raise DataError(
        f'max_examples must be a positive integer or None, got'
        f' {max_examples!r}.'
    )


def subsample(source: Source, max_examples: int | None) -> Source:
  """Returns `source` cut to `max_examples` with `stratified_first_k`.

  Strata are (split, group) when the source has groups, so every natural
  client keeps examples, and (split, class) for classification otherwise.

  Args:
    source: The full source.
    max_examples: Maximum number of examples, or None for all.
  """
  check_max_examples(max_examples)
  if max_examples is None or max_examples >= source.num_examples:
    return source
  split = source.is_test.astype(np.int64)
  if source.groups is not None:
    strata = split * len(source.group_names) + source.groups
  elif source.has_class_labels:
    strata = split * source.num_classes + source.y
  else:
    strata = split
  return source.take(stratified_first_k(strata, max_examples))
