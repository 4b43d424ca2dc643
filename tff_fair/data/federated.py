"""Per-client train/validation/test splits of a `Source`, served to TFF.

`build_federated_data` turns a pooled `Source` into clients:

1. Partition. For every partition except 'natural' the whole pooled source
   (its own train AND test examples) is partitioned. Personalized evaluation
   needs test data drawn from each client's own distribution, which the
   source's global test split cannot give under label or quantity skew. For
   'natural' the clients are the source's groups (FEMNIST writers,
   Shakespeare roles).
2. Cap. `examples_per_client` keeps a seeded random subset of each client's
   pool before splitting, stratified by class (by the source's test flag
   for 'natural') so the cap keeps the client's distribution.
3. Split each client's own pool. Non-natural: test = round(test_fraction *
   n), validation = round(validation_fraction * n), stratified per class
   when labels are 1-D; the rest is train. Natural: test = the client's
   examples from the source's test split, validation =
   round(validation_fraction * n_train_pool) carved out of the client's
   train-split examples; test_fraction is not used. A client left without
   any train example is an error; empty validation/test splits are allowed
   (they only happen for clients of a handful of examples).

4. Server held-out sets (optional, `server_held_out_examples=n`). The
   server keeps two disjoint sets of n examples each, 'validation' and
   'test', drawn from the examples no client holds after the cap, each with
   the class shares of the whole source. They estimate accuracies on the federation's overall
   distribution with far less noise than the clients' small splits (Aequa's
   width-accuracy curve and rewards); no client ever trains on them.
5. Rotation (optional, `rotated_client_fraction=f`). A seeded choice of
   round(f * clients) clients see every image of theirs (all three splits)
   turned 180 degrees: a concept shift with unchanged labels, the case
   clustered FL separates. The choice has its own random stream.

Everything is deterministic given `seed`. Each client's split uses its own
random stream spawned from the seed, so one client's split does not depend on
the sizes of the others.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
import dataclasses
import types
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.data import partition as partition_lib
from tff_fair.data.sources import source as source_lib

SPLITS = ('train', 'validation', 'test')
SERVER_SPLITS = ('validation', 'test')


@dataclasses.dataclass(frozen=True, eq=False)
class ClientSplits:
  """Positions into the Source of one client's examples, per split.

  Attributes:
    train: Sorted int64 positions of the training examples.
    validation: Sorted int64 positions of the validation examples.
    test: Sorted int64 positions of the test examples.
  """

  train: np.ndarray
  validation: np.ndarray
  test: np.ndarray

  def get(self, split: str) -> np.ndarray:
    """Returns the positions of `split` ('train', 'validation' or 'test')."""
    _check_split(split)
    return getattr(self, split)


def _check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(
        f'Unknown split {split!r}; use one of {", ".join(SPLITS)}.'
    )


@dataclasses.dataclass(frozen=True, eq=False)
class FederatedData:
  """A Source split into clients, each with train/validation/test indices.

  Attributes:
    source: The pooled source the indices point into.
    client_ids: Client names in a fixed order.
    splits: ClientSplits per client id.
    partition: Name of the partition scheme used.
    partition_params: Its parameters.
    seed: The seed everything was derived from.
    server_splits: Split name ('validation', 'test') -> sorted positions of
      the server's held-out examples, which no client holds; empty when the
      data was built without them.
    public: Sorted positions of the public set (examples no client holds,
      apart from the server's held-out sets) that distillation methods
      share; empty when the data was built without one.
    rotated_clients: The clients whose images (every split of theirs) are
      rotated 180 degrees, a concept shift: the same labels, different
      inputs (clustered FL's test case); empty by default.
  """

  source: source_lib.Source
  client_ids: tuple[str, ...]
  splits: Mapping[str, ClientSplits]
  partition: str = ''
  partition_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  seed: int | None = None
  server_splits: Mapping[str, np.ndarray] = dataclasses.field(
      default_factory=dict)
  public: np.ndarray = dataclasses.field(
      default_factory=lambda: np.zeros([0], np.int64))
  rotated_clients: tuple[str, ...] = ()

  def __post_init__(self):
    if set(self.splits) != set(self.client_ids) or len(
        set(self.client_ids)
    ) != len(self.client_ids):
      raise ValueError(
          'client_ids must be unique and match the keys of splits exactly;'
          ' build FederatedData with build_federated_data.'
      )
    object.__setattr__(self, 'client_ids', tuple(self.client_ids))
    object.__setattr__(
        self, 'splits', types.MappingProxyType(dict(self.splits))
    )
    object.__setattr__(
        self,
        'partition_params',
        types.MappingProxyType(dict(self.partition_params)),
    )
    object.__setattr__(
        self, 'server_splits', types.MappingProxyType(dict(self.server_splits))
    )

  @property
  def has_server_held_out(self) -> bool:
    return bool(self.server_splits)

  def server_arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the server's held-out 'validation' or 'test' set."""
    if split not in SERVER_SPLITS:
      raise ValueError(
          f'Unknown server split {split!r}; use one of'
          f' {", ".join(SERVER_SPLITS)}.'
      )
    if not self.server_splits:
      raise ValueError(
          'This data has no server held-out sets; build it with'
          ' server_held_out_examples > 0 (flag --server_held_out_examples).'
      )
    positions = self.server_splits[split]
    return self.source.x[positions], self.source.y[positions]

  def public_arrays(self) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the public set (a distillation method uses x only)."""
    if not len(self.public):
      raise ValueError(
          'This data has no public set; build it with public_examples > 0'
          ' (flag --public_examples).')
    return self.source.x[self.public], self.source.y[self.public]

  def indices(self, client_id: str, split: str) -> np.ndarray:
    """Positions into `source` of a client's split."""
    if client_id not in self.splits:
      raise ValueError(
          f'Unknown client {client_id!r}; valid ids are in'
          f' FederatedData.client_ids (e.g. {self.client_ids[:3]}).'
      )
    return self.splits[client_id].get(split)

  def arrays(self, client_id: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) numpy arrays of a client's split."""
    positions = self.indices(client_id, split)
    return self.source.x[positions], self.source.y[positions]

  def num_examples(self, client_id: str, split: str) -> int:
    return len(self.indices(client_id, split))

  def dataset(self, client_id: str, split: str) -> tf.data.Dataset:
    """Unbatched tf.data.Dataset of OrderedDict(x=..., y=...) elements."""
    x, y = self.arrays(client_id, split)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))

  def client_data(
      self, split: str, *, batch_size: int | None = None
  ) -> tff.simulation.datasets.ClientData:
    """A TFF ClientData over one split of every client.

    Datasets are built on demand: `create_tf_dataset_for_client(cid)` slices
    only that client's arrays (TFF itself builds the first client's dataset
    once to learn the element spec). When the dataset function is traced
    with a string tensor (e.g. `create_tf_dataset_from_all_clients`, which
    maps over client ids inside tf.data), the split's arrays are embedded in
    the traced graph once and sliced per client there.

    Args:
      split: 'train', 'validation' or 'test'.
      batch_size: If set, datasets are batched (last batch kept).

    Returns:
      ClientData whose elements are OrderedDict(x=..., y=...).
    """
    _check_split(split)
    if batch_size is not None and (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, (int, np.integer))
        or batch_size < 1
    ):
      raise ValueError(
          f'batch_size must be a positive integer or None, got {batch_size!r}.'
      )

    def maybe_batch(dataset: tf.data.Dataset) -> tf.data.Dataset:
      return dataset if batch_size is None else dataset.batch(batch_size)

    traced = _TracedSplit(self, split)

    def dataset_fn(client_id) -> tf.data.Dataset:
      if isinstance(client_id, (bytes, np.bytes_)):
        client_id = client_id.decode('utf-8')
      if tf.is_tensor(client_id) and tf.executing_eagerly():
        client_id = client_id.numpy().decode('utf-8')
      if isinstance(client_id, str):
        return maybe_batch(self.dataset(client_id, split))
      return maybe_batch(traced.dataset(client_id))

    return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
        list(self.client_ids), dataset_fn
    )

  def summary(self) -> str:
    """A printable table of split sizes and train class histograms."""
    return format_summary(self)


class _TracedSplit:
  """Graph-friendly access to one split of all clients (built lazily)."""

  def __init__(self, data: FederatedData, split: str):
    self._data = data
    self._split = split
    self._arrays = None

  def _build(self):
    client_ids = self._data.client_ids
    positions = [self._data.indices(c, self._split) for c in client_ids]
    counts = np.array([len(p) for p in positions], np.int64)
    order = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    self._arrays = (
        np.array([c.encode('utf-8') for c in client_ids], dtype=object),
        np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64),
        counts,
        self._data.source.x[order],
        self._data.source.y[order],
    )

  def dataset(self, client_id: tf.Tensor) -> tf.data.Dataset:
    if self._arrays is None:
      self._build()
    ids, offsets, counts, x, y = (tf.constant(a) for a in self._arrays)
    match = tf.equal(ids, client_id)
    check = tf.debugging.Assert(
        tf.reduce_any(match), ['Unknown client id:', client_id]
    )
    with tf.control_dependencies([check]):
      position = tf.argmax(tf.cast(match, tf.int32))
    start = offsets[position]
    end = start + counts[position]
    return tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x[start:end], y=y[start:end])
    )


# ----------------------------------------------------------------------------
# Splitting (pure numpy).
# ----------------------------------------------------------------------------


def stratified_order(
    strata: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
  """A random permutation whose every prefix is stratified.

  Each member of a stratum of size n_s gets the key (r + u) / n_s, with r a
  random rank in the stratum and u one uniform offset per stratum; sorting
  by key interleaves the strata evenly (systematic sampling). So the first k
  positions contain within one of k * n_s / n members of every stratum, and
  totals are exact.

  Args:
    strata: Stratum (e.g. class) per position, shape (n,).
    rng: Random generator.

  Returns:
    int64 permutation of range(n).
  """
  strata = np.asarray(strata)
  keys = np.empty(len(strata))
  for stratum in np.unique(strata):
    members = np.flatnonzero(strata == stratum)
    ranks = rng.permutation(len(members))
    keys[members] = (ranks + rng.random()) / len(members)
  return np.argsort(keys, kind='stable').astype(np.int64)


def _round_half_up(value: float) -> int:
  # Python's round() rounds half to even; explicit half-up is easier to state.
  return int(np.floor(value + 0.5))


def _check_fractions(validation_fraction: float, test_fraction: float) -> None:
  for name, value in (
      ('validation_fraction', validation_fraction),
      ('test_fraction', test_fraction),
  ):
    if not 0 <= value < 1:
      raise ValueError(f'{name} must be in [0, 1), got {value!r}.')
  if validation_fraction + test_fraction >= 1:
    raise ValueError(
        f'validation_fraction + test_fraction = '
        f'{validation_fraction + test_fraction} leaves no training data; their'
        ' sum must be below 1.'
    )


def _no_train_error(client_id: str, n: int, detail: str) -> ValueError:
  return ValueError(
      f'Client {client_id} has {n} examples and {detail}, which leaves no'
      ' training example. Lower validation_fraction/test_fraction, use fewer'
      ' clients, or raise examples_per_client.'
  )


def split_pool(
    positions: np.ndarray,
    strata: np.ndarray,
    validation_fraction: float,
    test_fraction: float,
    rng: np.random.Generator,
    client_id: str = 'client',
) -> ClientSplits:
  """Splits one client's pool into train/validation/test, stratified.

  Args:
    positions: The client's positions into the source.
    strata: Stratum (class) per entry of `positions`.
    validation_fraction: Fraction for validation.
    test_fraction: Fraction for test.
    rng: Random generator.
    client_id: Name used in error messages.

  Returns:
    The client's ClientSplits.
  """
  n = len(positions)
  n_test = _round_half_up(test_fraction * n)
  n_val = _round_half_up(validation_fraction * n)
  if n - n_test - n_val < 1:
    raise _no_train_error(
        client_id, n, f'{n_test} go to test and {n_val} to validation'
    )
  shuffled = positions[stratified_order(strata, rng)]
  return ClientSplits(
      train=np.sort(shuffled[n_test + n_val :]),
      validation=np.sort(shuffled[n_test : n_test + n_val]),
      test=np.sort(shuffled[:n_test]),
  )


def split_natural_pool(
    positions: np.ndarray,
    strata: np.ndarray,
    is_test: np.ndarray,
    validation_fraction: float,
    rng: np.random.Generator,
    client_id: str = 'client',
) -> ClientSplits:
  """Splits a natural client: test from the source, validation from train.

  Args:
    positions: The client's positions into the source.
    strata: Stratum (class) per entry of `positions`, for the validation cut.
    is_test: Source test flag per entry of `positions`.
    validation_fraction: Fraction of the client's train-split examples moved
      to validation.
    rng: Random generator.
    client_id: Name used in error messages.
  """
  train_pool, pool_strata = positions[~is_test], strata[~is_test]
  n_val = _round_half_up(validation_fraction * len(train_pool))
  if len(train_pool) - n_val < 1:
    raise _no_train_error(
        client_id,
        len(positions),
        f'{len(train_pool)} in the source train split of which {n_val} go'
        ' to validation',
    )
  shuffled = train_pool[stratified_order(pool_strata, rng)]
  return ClientSplits(
      train=np.sort(shuffled[n_val:]),
      validation=np.sort(shuffled[:n_val]),
      test=np.sort(positions[is_test]),
  )


def _cap_pool(
    positions: np.ndarray,
    strata: np.ndarray,
    cap: int | None,
    rng: np.random.Generator,
) -> np.ndarray:
  if cap is None or len(positions) <= cap:
    return positions
  return np.sort(positions[stratified_order(strata, rng)[:cap]])


def _client_names(
    source: source_lib.Source, parts: list[np.ndarray], natural: bool
) -> tuple[str, ...]:
  if natural:
    return tuple(source.group_names[source.groups[p[0]]] for p in parts)
  width = max(4, len(str(len(parts) - 1)))
  return tuple(f'client_{i:0{width}d}' for i in range(len(parts)))


def build_federated_data(
    source: source_lib.Source,
    *,
    partition: str,
    num_clients: int | None,
    seed: int,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.2,
    examples_per_client: int | None = None,
    server_held_out_examples: int = 0,
    public_examples: int = 0,
    rotated_client_fraction: float = 0.0,
    **partition_params: Any,
) -> FederatedData:
  """Partitions a Source into clients and splits each client's own data.

  See the module docstring for the exact rules.

  Args:
    source: The pooled source.
    partition: A key of `partition.PARTITIONS`.
    num_clients: Number of clients (None with 'natural' keeps every group).
    seed: Seed for the partition, the cap and the splits.
    validation_fraction: Fraction of each client's pool for validation.
    test_fraction: Fraction of each client's pool for test (not used by
      'natural', which keeps the source's own test split).
    examples_per_client: Cap on each client's pool before splitting.
    server_held_out_examples: Size of each of the server's two held-out
      sets (0: none); see the module docstring.
    public_examples: Size of the public set (0: none): examples neither a
      client nor the server's held-out sets hold, with the class shares of
      the source, drawn from their own random stream (so every other split
      is the same with or without it).
    rotated_client_fraction: Share of the clients (a seeded choice of
      round(share * clients), at least one when > 0) whose images, in
      every split of theirs, are rotated 180 degrees; in [0, 1). Needs an
      image source. The server's held-out and public sets stay upright.
    **partition_params: The partition's parameters (alpha, kappa, m, ...).

  Returns:
    The FederatedData.

  Raises:
    ValueError: bad fractions or cap, a partition that needs class labels on
      a sequence source, an impossible partition, a client left without
      training data, or too few unheld examples for the server's sets.
  """
  _check_fractions(validation_fraction, test_fraction)
  _check_rotation(source, rotated_client_fraction)
  for name, value in (('server_held_out_examples', server_held_out_examples),
                      ('public_examples', public_examples)):
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
        or value < 0):
      raise ValueError(
          f'{name} must be a non-negative integer, got {value!r}.')
  if examples_per_client is not None and (
      isinstance(examples_per_client, bool)
      or not isinstance(examples_per_client, (int, np.integer))
      or examples_per_client < 1
  ):
    raise ValueError(
        'examples_per_client must be a positive integer or None, got'
        f' {examples_per_client!r}.'
    )
  natural = partition == 'natural'
  if natural and source.groups is None:
    raise ValueError(
        f"Source {source.name!r} has no natural groups, so partition='natural'"
        ' is impossible; use homogeneous, dirichlet, quantity_skew or'
        ' label_skew.'
    )
  if source.has_class_labels:
    labels = source.y
  elif getattr(
      partition_lib.PARTITIONS.get(partition), 'requires_class_labels', False
  ):
    raise ValueError(
        f'Partition {partition!r} needs one class label per example, but'
        f' {source.name!r} has sequence targets; use natural, homogeneous or'
        ' quantity_skew.'
    )
  else:
    # Without class labels the pool is one stratum: homogeneous becomes an
    # even random split and stratification a plain shuffle.
    labels = np.zeros(source.num_examples, np.int64)
  parts = partition_lib.partition(
      partition,
      labels,
      num_clients,
      seed,
      groups=source.groups,
      **partition_params,
  )
  client_ids = _client_names(source, parts, natural)
  streams = np.random.SeedSequence([seed, 0x5EED]).spawn(len(parts))
  splits = {}
  for client_id, positions, stream in zip(client_ids, parts, streams):
    rng = np.random.default_rng(stream)
    if natural:
      positions = _cap_pool(
          positions, source.is_test[positions], examples_per_client, rng
      )
      splits[client_id] = split_natural_pool(
          positions,
          labels[positions],
          source.is_test[positions],
          validation_fraction,
          rng,
          client_id,
      )
    else:
      positions = _cap_pool(
          positions, labels[positions], examples_per_client, rng
      )
      splits[client_id] = split_pool(
          positions,
          labels[positions],
          validation_fraction,
          test_fraction,
          rng,
          client_id,
      )
  server_splits = {}
  if server_held_out_examples:
    server_splits = _server_splits(
        source.num_examples, splits.values(), labels,
        server_held_out_examples, seed)
  public = np.zeros([0], np.int64)
  if public_examples:
    public = _public_set(source.num_examples, splits.values(),
                         server_splits.values(), labels, public_examples,
                         seed)
  rotated = _rotated_clients(client_ids, rotated_client_fraction, seed)
  return FederatedData(
      source=_rotate(source, [splits[c] for c in rotated]),
      client_ids=client_ids,
      splits=splits,
      partition=partition,
      partition_params=dict(
          partition_params,
          validation_fraction=validation_fraction,
          # 'natural' keeps the source's test split; don't report a fraction.
          **({} if natural else {'test_fraction': test_fraction}),
          examples_per_client=examples_per_client,
          **({'server_held_out_examples': server_held_out_examples}
             if server_held_out_examples else {}),
          **({'public_examples': public_examples}
             if public_examples else {}),
          **({'rotated_client_fraction': rotated_client_fraction}
             if rotated_client_fraction else {}),
      ),
      seed=seed,
      server_splits=server_splits,
      public=public,
      rotated_clients=rotated,
  )


def _check_rotation(source: source_lib.Source, fraction: float) -> None:
  if not (isinstance(fraction, (int, float, np.floating))
          and 0.0 <= fraction < 1.0):
    raise ValueError(
        f'rotated_client_fraction must be a number in [0, 1), got'
        f' {fraction!r}.')
  if fraction and (source.x.ndim < 3
                   or not np.issubdtype(source.x.dtype, np.floating)):
    raise ValueError(
        f'rotated_client_fraction={fraction} rotates images, but'
        f' {source.name!r} holds {source.x.dtype} inputs of shape'
        f' {source.x.shape[1:]}; use 0 with this data set.')


def _rotated_clients(client_ids: Sequence[str], fraction: float,
                     seed: int) -> tuple[str, ...]:
  """A seeded choice of round(fraction * clients) (at least one), in
  client order; its own random stream, so the splits do not depend on it."""
  if not fraction:
    return ()
  count = max(1, int(round(fraction * len(client_ids))))
  rng = np.random.default_rng([seed, 0x207A7E])
  chosen = np.sort(rng.choice(len(client_ids), size=count, replace=False))
  return tuple(client_ids[i] for i in chosen)


def _rotate(source: source_lib.Source,
            clients: Sequence[ClientSplits]) -> source_lib.Source:
  """`source` with the rows of `clients` (all their splits) turned 180
  degrees in the image plane; the source itself when there are none."""
  if not clients:
    return source
  rows = np.concatenate([c.get(split) for c in clients for split in SPLITS])
  x = np.array(source.x)
  x[rows] = np.rot90(x[rows], 2, axes=(1, 2))
  return dataclasses.replace(source, x=x)


def _unheld(num_examples: int, client_splits: Iterable[ClientSplits],
            others: Iterable[np.ndarray] = ()) -> np.ndarray:
  """The positions no client (and no set of `others`) holds."""
  held = np.zeros(num_examples, bool)
  for client in client_splits:
    for split in SPLITS:
      held[client.get(split)] = True
  for positions in others:
    held[positions] = True
  return np.flatnonzero(~held)


def _stratified_draw(unheld: np.ndarray, labels: np.ndarray, wanted: int,
                     rng: np.random.Generator) -> np.ndarray:
  """`wanted` of `unheld`, each class with its share of the whole source
  (as far as unheld examples allow; any shortfall filled at random), in a
  stratified order (every prefix is stratified too)."""
  classes, counts = np.unique(labels, return_counts=True)
  exact = wanted * counts / counts.sum()
  quota = np.floor(exact).astype(np.int64)
  # Largest remainders get the examples the floors leave out.
  quota[np.argsort(quota - exact, kind='stable')[:wanted - quota.sum()]] += 1
  chosen = []
  for label, share in zip(classes, quota):
    members = unheld[labels[unheld] == label]
    chosen.append(rng.permutation(members)[:share])
  chosen = np.concatenate(chosen)
  if len(chosen) < wanted:
    spare = np.setdiff1d(unheld, chosen)
    chosen = np.concatenate(
        [chosen, rng.permutation(spare)[:wanted - len(chosen)]])
  return chosen[stratified_order(labels[chosen], rng)]


def _public_set(num_examples: int, client_splits: Iterable[ClientSplits],
                server_splits: Iterable[np.ndarray], labels: np.ndarray,
                size: int, seed: int) -> np.ndarray:
  """The public set: `size` examples held by no client nor server set."""
  unheld = _unheld(num_examples, client_splits, server_splits)
  if size > len(unheld):
    raise ValueError(
        f'public_examples={size} needs {size} examples that no client and no'
        f' server held-out set holds, but only {len(unheld)} are left.'
        ' Lower public_examples, or lower examples_per_client / use fewer'
        ' clients so the clients hold less of the data.')
  rng = np.random.default_rng(np.random.SeedSequence([seed, 0x9B11C]))
  return np.sort(_stratified_draw(unheld, labels, size, rng))


def _server_splits(
    num_examples: int,
    client_splits: Iterable[ClientSplits],
    labels: np.ndarray,
    size: int,
    seed: int,
) -> dict[str, np.ndarray]:
  """The server's validation and test sets from examples no client holds.

  What the clients leave is skewed by the partition, so each class gets
  its share of the whole source (as far as unheld examples allow; any
  shortfall is filled at random). They come from their own random stream,
  so the clients' splits are the same with or without them.
  """
  unheld = _unheld(num_examples, client_splits)
  wanted = 2 * size
  if wanted > len(unheld):
    raise ValueError(
        f'server_held_out_examples={size} needs {wanted} examples that no'
        f' client holds, but only {len(unheld)} are left. Lower'
        ' server_held_out_examples, or lower examples_per_client / use fewer'
        ' clients so the clients hold less of the data.'
    )
  rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E4E4]))
  # Every prefix of a stratified order is stratified: so are both halves.
  chosen = _stratified_draw(unheld, labels, wanted, rng)
  return {'validation': np.sort(chosen[:size]), 'test': np.sort(chosen[size:])}


# ----------------------------------------------------------------------------
# Summary.
# ----------------------------------------------------------------------------


def _histogram(labels: np.ndarray, num_classes: int) -> str:
  counts = np.bincount(labels, minlength=num_classes)
  # Only non-zero classes: 62 FEMNIST classes would not fit a line otherwise.
  return ' '.join(f'{c}:{n}' for c, n in enumerate(counts) if n)


def format_summary(data: FederatedData) -> str:
  """Table of client id, train/validation/test counts and train histogram."""
  params = ', '.join(f'{k}={v}' for k, v in data.partition_params.items())
  lines = [
      f'FederatedData: source={data.source.name} partition={data.partition}'
      f' ({params}) seed={data.seed} clients={len(data.client_ids)}'
  ]
  width = max([len('client')] + [len(c) for c in data.client_ids])
  header = f'{"client":<{width}}  {"train":>6}  {"val":>6}  {"test":>6}'
  if data.source.has_class_labels:
    header += '  train classes (class:count)'
  lines.append(header)
  totals = np.zeros(3, np.int64)
  for client_id in data.client_ids:
    counts = [data.num_examples(client_id, s) for s in SPLITS]
    totals += counts
    row = f'{client_id:<{width}}' + ''.join(f'  {c:>6}' for c in counts)
    if data.source.has_class_labels:
      train_labels = data.source.y[data.indices(client_id, 'train')]
      row += '  ' + _histogram(train_labels, data.source.num_classes)
    if client_id in data.rotated_clients:
      row += '  (images rotated 180 degrees)'
    lines.append(row)
  lines.append(
      f'{"total":<{width}}  {totals[0]:>6}  {totals[1]:>6}  {totals[2]:>6}'
  )
  if data.has_server_held_out:
    lines.append(
        f'{"server":<{width}}  {0:>6}'
        + ''.join(f'  {len(data.server_splits[s]):>6}' for s in SERVER_SPLITS)
        + '  (held out; no client holds these)'
    )
  return '\n'.join(lines)
