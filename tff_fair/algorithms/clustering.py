"""Clustered FL's server decisions, in numpy (Sattler, Mueller, Samek 2020).

What the server of clustered FL decides between rounds, from the round's
client updates alone; `tff_fair.algorithms.cfl` trains the clusters in TFF
and applies these decisions to its state. Plain numpy: no TensorFlow.

The clusters form a tree of slots (the paper's parameter tree): slot 0 is
the root cluster of every client; splitting a cluster c adds two slots,
its sub-clusters, whose parent is c. The leaves are the clusters that
train; an inner slot keeps its model as it was at the split. Each client
sits at one slot (`membership`): a leaf, or an inner slot while it is not
placed yet (it was not sampled when that cluster split).

A round (`decide`):

1. Placement. A sampled client at an inner slot p trained from p's model;
   if its update is finite (weight > 0), it moves to the sub-cluster of p
   whose direction (the mean update of its members in the split round,
   also computed at p's model) its own update is more similar to
   (cosine), one level per round.
2. Splits. A leaf c with n > 2 sampled members (updates of weight > 0)
   splits when, after `warmup_rounds`, its weighted mean update is small
   and its largest update is large:

       ||sum_i w_i u_i / sum_i w_i|| < eps1   and   max_i ||u_i|| > eps2

   (the joint model is near a stationary point that some clients are far
   from), while the tree has two free slots (`num_slots`). Its sampled
   members are bi-partitioned by complete linkage on the distances
   -cos(u_i, u_j); the partition's positions are mapped back to client
   indices (the reference code appends the positions themselves, a bug).
   Members not sampled stay at c, now inner, until placed.
3. Separation. The split is made only if the two halves' updates point
   apart: every similarity within a half exceeds every similarity across
   them by more than `min_separation`,

       min_{k; i, j in half k} cos(u_i, u_j)
           - max_{i in half 1, j in half 2} cos(u_i, u_j) > min_separation

   (a half of one client counts as 1 within). A gap > 0 is the paper's
   condition for a bi-partition that separates congruent from incongruent
   clients; without it, the norm criterion alone also splits a federation
   with no groups once its model has converged.
"""

from collections.abc import Sequence
import dataclasses
import math
import numbers

import numpy as np

# The floor of the product of norms in a cosine (zero updates: cosine 0).
_COSINE_EPSILON = 1e-12
# `split_round` of a slot not in use.
UNUSED = -1
# `parent` of the root and of unused slots.
NO_PARENT = -1


def cosine_similarities(vectors: np.ndarray) -> np.ndarray:
  """Pairwise cosines of the rows of `vectors` ([n, d] -> [n, n], float64).

  A zero row has cosine 0 with every row, itself included.
  """
  v = np.asarray(vectors, np.float64)
  norms = np.linalg.norm(v, axis=1)
  return (v @ v.T) / np.maximum(np.outer(norms, norms), _COSINE_EPSILON)


def complete_linkage_bipartition(
    distances: np.ndarray) -> tuple[list[int], list[int]]:
  """Agglomerative clustering with complete linkage, stopped at 2 clusters.

  Starts from singletons and merges, until two are left, the pair of
  clusters whose largest distance between members is smallest (ties: the
  first pair in row-major order of the cluster representatives). Distances
  may be negative (e.g. -cosine); only their order matters.

  Args:
    distances: Symmetric [n, n] matrix, n >= 2; the diagonal is ignored.

  Returns:
    The two clusters as sorted positions into `distances`, the one holding
    position 0 first.

  Raises:
    ValueError: For a matrix that is not square, symmetric and finite, or
      has fewer than 2 rows.
  """
  d = np.array(distances, np.float64)
  if d.ndim != 2 or d.shape[0] != d.shape[1] or d.shape[0] < 2:
    raise ValueError(f'distances must be an [n, n] matrix with n >= 2, got'
                     f' shape {d.shape}.')
  if not np.all(np.isfinite(d)) or not np.array_equal(d, d.T):
    raise ValueError('distances must be finite and symmetric.')
  n = len(d)
  np.fill_diagonal(d, np.inf)
  members = {i: [i] for i in range(n)}
  for _ in range(n - 2):
    i, j = np.unravel_index(np.argmin(d), d.shape)
    i, j = min(i, j), max(i, j)
    # Lance-Williams for complete linkage: the merged cluster's distance to
    # any other is the larger of its parts'.
    merged = np.maximum(d[i], d[j])
    d[i, :] = merged
    d[:, i] = merged
    d[i, i] = np.inf
    d[j, :] = np.inf
    d[:, j] = np.inf
    members[i] += members.pop(j)
  first, second = sorted(sorted(m) for m in members.values())
  return first, second


@dataclasses.dataclass(frozen=True)
class SplitRule:
  """When a cluster splits (the module docstring's criterion).

  Attributes:
    eps1: A cluster splits only if its weighted mean update's norm is
      below this (the paper's 0.4).
    eps2: ... and its largest update's norm above this (the paper's 1.6).
    warmup_rounds: No split in rounds <= this (the reference's 20).
    min_separation: A split is made only if its separation gap is above
      this (the paper's 0; -2, below any gap, turns the check off).
  """

  eps1: float = 0.4
  eps2: float = 1.6
  warmup_rounds: int = 20
  min_separation: float = 0.0

  def __post_init__(self):
    if not (math.isfinite(self.eps1) and self.eps1 > 0):
      raise ValueError(f'eps1 must be a finite number > 0, got {self.eps1}.')
    if not (math.isfinite(self.eps2) and self.eps2 >= 0):
      raise ValueError(f'eps2 must be a finite number >= 0, got {self.eps2}.')
    check_count('warmup_rounds', self.warmup_rounds, 0)
    if not (math.isfinite(self.min_separation)
            and -2 <= self.min_separation < 2):
      raise ValueError('min_separation must be a number in [-2, 2) (a'
                       ' difference of cosines), got'
                       f' {self.min_separation}.')

  def splits(self, mean_norm: float, max_norm: float, sampled: int,
             round_num: int) -> bool:
    """Whether a cluster splits, free slots aside."""
    return (round_num > self.warmup_rounds and sampled > 2
            and mean_norm < self.eps1 and max_norm > self.eps2)


def separation_gap(similarities: np.ndarray,
                   halves: Sequence[Sequence[int]]) -> float:
  """The smallest similarity within a half minus the largest across.

  Args:
    similarities: [n, n] cosine similarities.
    halves: Two disjoint lists of positions into `similarities`.

  Returns:
    The gap (step 3 of the module docstring); a half of one position has
    no pair within and counts as similarity 1 (a cosine's largest).
  """
  first, second = (np.asarray(h, np.int64) for h in halves)
  cross = float(similarities[np.ix_(first, second)].max())
  within = [similarities[np.ix_(h, h)][np.triu_indices(len(h), 1)]
            for h in (first, second) if len(h) > 1]
  least_within = min((float(w.min()) for w in within), default=1.0)
  return least_within - cross


def check_count(name: str, value, minimum: int) -> None:
  """Raises `ValueError` unless `value` is an int >= `minimum`."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < minimum):
    raise ValueError(f'{name} must be an int >= {minimum}, got {value!r}.')


def num_slots(max_clusters: int) -> int:
  """Slots of a tree of up to `max_clusters` leaves (a split adds 2)."""
  check_count('max_clusters', max_clusters, 1)
  return 2 * max_clusters - 1


def leaves(parent: np.ndarray, split_round: np.ndarray) -> list[int]:
  """The slots in use that no slot has as parent: the training clusters."""
  used = np.flatnonzero(np.asarray(split_round) != UNUSED)
  inner = set(np.asarray(parent)[used].tolist())
  return [int(s) for s in used if s not in inner]


@dataclasses.dataclass(frozen=True)
class ClientUpdate:
  """One sampled client's round, as the server saw it.

  Attributes:
    index: The client's index in [0, num_clients).
    slot: The slot it trained from.
    update: Its update, flattened (TFF's sign: initial - trained).
    weight: Its aggregation weight (0: its update was not finite).
  """

  index: int
  slot: int
  update: np.ndarray
  weight: float


@dataclasses.dataclass(frozen=True)
class ClusterRound:
  """A leaf's round: its sampled members' norms and whether it split.

  Attributes:
    cluster: The slot.
    sampled: Its members whose updates it aggregated (weight > 0).
    mean_norm: The norm of their weighted mean update.
    max_norm: The largest norm of their updates.
    children: The two sub-clusters' slots if it split, else ().
    groups: Their members' client indices (sampled members only).
    separation: The separation gap of its bi-partition when the norms
      called for a split (NaN otherwise); below `min_separation` it did
      not split.
  """

  cluster: int
  sampled: int
  mean_norm: float
  max_norm: float
  children: tuple[int, ...] = ()
  groups: tuple[tuple[int, ...], ...] = ()
  separation: float = math.nan


@dataclasses.dataclass(frozen=True)
class Decisions:
  """What the server decided after a round.

  Attributes:
    clusters: The round of each leaf that had sampled members, by slot.
    placed: Client index -> the sub-cluster it moved to by its update.
    directions: New slot -> the weighted mean update (flat) of the
      members that formed it.
  """

  clusters: tuple[ClusterRound, ...]
  placed: dict[int, int]
  directions: dict[int, np.ndarray]

  @property
  def splits(self) -> tuple[ClusterRound, ...]:
    return tuple(c for c in self.clusters if c.children)


def _mean(updates: Sequence[ClientUpdate]) -> np.ndarray:
  weights = np.array([u.weight for u in updates], np.float64)
  stacked = np.stack([u.update for u in updates]).astype(np.float64)
  return weights @ stacked / weights.sum()


def decide(parent: np.ndarray, split_round: np.ndarray,
           directions: np.ndarray, updates: Sequence[ClientUpdate],
           round_num: int, rule: SplitRule) -> Decisions:
  """The placements and splits after round `round_num`.

  Args:
    parent: int[S], each slot's parent (`NO_PARENT` for the root).
    split_round: int[S], the round each slot was made (`UNUSED` if not).
    directions: [S, d], each slot's direction (flat).
    updates: The round's sampled clients.
    round_num: The round just run (1 for the first).
    rule: The split criterion.

  Returns:
    The `Decisions`; `apply` enacts them.
  """
  parent = np.asarray(parent)
  in_leaf = set(leaves(parent, split_round))
  placed = {}
  for u in updates:
    # A non-finite update (weight 0) says nothing of where a client belongs.
    if u.slot not in in_leaf and u.weight > 0:
      children = np.flatnonzero(parent == u.slot)
      # Ties go to the lower slot: argmax takes the first.
      similarity = cosine_similarities(
          np.stack([u.update, *directions[children]]))[0, 1:]
      placed[u.index] = int(children[np.argmax(similarity)])
  free = [s for s in range(len(parent)) if split_round[s] == UNUSED]
  clusters, new_directions = [], {}
  for slot in sorted(in_leaf):
    members = [u for u in updates if u.slot == slot and u.weight > 0]
    if not members:
      continue
    mean_norm = float(np.linalg.norm(_mean(members)))
    max_norm = float(max(np.linalg.norm(u.update) for u in members))
    record = ClusterRound(slot, len(members), mean_norm, max_norm)
    if len(free) >= 2 and rule.splits(mean_norm, max_norm, len(members),
                                      round_num):
      similarities = cosine_similarities(np.stack([u.update
                                                   for u in members]))
      positions = complete_linkage_bipartition(-similarities)
      gap = separation_gap(similarities, positions)
      record = dataclasses.replace(record, separation=gap)
      if gap > rule.min_separation:
        # Positions into `members`, mapped back to the clients they are.
        groups = tuple(tuple(members[p].index for p in group)
                       for group in positions)
        children = (free.pop(0), free.pop(0))
        for child, group in zip(children, positions):
          new_directions[child] = _mean([members[p] for p in group])
        record = dataclasses.replace(record, children=children,
                                     groups=groups)
    clusters.append(record)
  return Decisions(tuple(clusters), placed, new_directions)


def apply(membership: np.ndarray, parent: np.ndarray,
          split_round: np.ndarray, decisions: Decisions,
          round_num: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """New (membership, parent, split_round) after `decisions` (copies).

  The sub-clusters' models and directions are the caller's (they live
  beside these in its state).
  """
  membership, parent, split_round = (np.array(a) for a in (
      membership, parent, split_round))
  for index, slot in decisions.placed.items():
    membership[index] = slot
  for cluster in decisions.splits:
    for child, group in zip(cluster.children, cluster.groups):
      parent[child] = cluster.cluster
      split_round[child] = round_num
      membership[list(group)] = child
  return membership, parent, split_round
