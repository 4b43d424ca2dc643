"""Contribution tracking and width rewards during training (numpy only).

Training-time Aequa rewards each client, round by round, with the widest
sub-model its contribution so far earns. Three small parts, each
replaceable:

1. An **assessment** scores the clients of one round, `c~_i`:
   * `cosine_to_aggregate` (default, CGSV's measure): the cosine similarity
     of a client's update to the aggregate of the round's unit-normalized
     updates. Aequa measures it on the common minimum-width sub-network, so
     every client is compared on the same parameters: pass those parameters
     flattened. With `leave_one_out`, the aggregate of the other clients'
     updates: a client's own share of the aggregate no longer vouches for
     it (see the function).
   * `data_size`: the client's number of examples over the largest.
2. The **tracker** smooths each client's assessments,
   `c_i <- gamma * c_i + (1 - gamma) * c~_i`; a client's first assessment
   is taken as is (no prior pulls it), clients not assessed in a round
   keep their value. Its state round-trips through JSON for checkpoints.
3. A **reward mechanism** `nu` maps contributions to maximum widths in
   [p_min, p_max]: `proportional_widths` normalizes contributions by the
   largest (negative ones count as 0) and maps linearly, raised to
   `exponent`, so the top contributor(s) get p_max and a client whose
   contribution is 0 gets p_min. An exponent above 1 widens the gap between
   weak and strong contributors.
"""

from collections.abc import Callable, Mapping
import dataclasses
import math
from typing import Any

import numpy as np

ClientId = str
Assessment = Mapping[ClientId, float]
RewardFn = Callable[[Mapping[ClientId, float]], dict[ClientId, float]]

# Floor of an update's norm when normalizing, as in the CGSV reference code.
_NORM_EPSILON = 1e-7


def cosine_to_aggregate(
    updates: Mapping[ClientId, np.ndarray],
    weights: Mapping[ClientId, float] | None = None,
    leave_one_out: bool = False,
) -> dict[ClientId, float]:
  """CGSV's assessment: each update's cosine to the aggregate direction.

  Every update is first scaled to unit norm, so a client cannot steer the
  aggregate (or its own score) by the size of its update; the aggregate is
  the `weights`-weighted mean of those unit updates (equal weights by
  default).

  CGSV's aggregate includes the client scored. An update unrelated to all
  others (random labels) then still scores about w_i / (sum(w) |aggregate|)
  > 0, its own share; so does every client, by the same token. With
  `leave_one_out` each client is scored against the others' aggregate
  instead: an unrelated update scores about 0, but so does an honest
  client whose data no one else resembles.

  Args:
    updates: Client id -> its model update, flattened to one vector (all of
      the same length; e.g. the minimum-width sub-network's parameters).
    weights: Client id -> aggregation weight (e.g. examples); non-negative,
      not all zero.
    leave_one_out: Score each client against the aggregate of the others.

  Returns:
    Client id -> cosine in [-1, 1]. A zero update scores 0, and so does
    every client when the aggregate it is scored against is 0.
  """
  if not updates:
    raise ValueError('cosine_to_aggregate needs at least one update.')
  ids = list(updates)
  vectors = [np.asarray(updates[i], np.float64).ravel() for i in ids]
  if len({v.size for v in vectors}) != 1:
    raise ValueError('Every update must have the same number of parameters.')
  if weights is None:
    w = np.ones(len(ids))
  else:
    missing = set(ids) - set(weights)
    if missing:
      raise ValueError(f'No weight for clients {sorted(missing)}.')
    w = np.array([float(weights[i]) for i in ids])
    if np.any(w < 0) or not np.any(w > 0) or not np.all(np.isfinite(w)):
      raise ValueError(f'Weights must be finite, >= 0 and not all 0: {w}.')
  units = np.stack([v / max(np.linalg.norm(v), _NORM_EPSILON)
                    for v in vectors])
  total = w @ units
  scores = []
  for k, unit in enumerate(units):
    reference, reference_weight = ((total - w[k] * unit, w.sum() - w[k])
                                   if leave_one_out else (total, w.sum()))
    norm = np.linalg.norm(reference)
    # Updates that cancel (a weighted mean below the floor): no direction.
    if reference_weight <= 0 or norm < _NORM_EPSILON * reference_weight:
      scores.append(0.0)
    else:
      scores.append(unit @ reference / norm)
  return {i: float(np.clip(s, -1.0, 1.0)) for i, s in zip(ids, scores)}


def data_size(num_examples: Mapping[ClientId, int]) -> dict[ClientId, float]:
  """Assessment by data size: each client's examples over the largest."""
  if not num_examples:
    raise ValueError('data_size needs at least one client.')
  largest = max(num_examples.values())
  if largest <= 0 or min(num_examples.values()) < 0:
    raise ValueError(f'Example counts must be >= 0, one > 0: {num_examples}.')
  return {i: n / largest for i, n in num_examples.items()}


@dataclasses.dataclass
class ContributionTracker:
  """Each client's contribution, smoothed over the rounds it was assessed in.

  Attributes:
    gamma: Weight of the past in [0, 1): 0 keeps only the latest assessment.
    contributions: Client id -> current contribution.
    rounds_assessed: Client id -> number of assessments so far.
  """

  gamma: float
  contributions: dict[ClientId, float] = dataclasses.field(
      default_factory=dict)
  rounds_assessed: dict[ClientId, int] = dataclasses.field(
      default_factory=dict)

  def __post_init__(self):
    if not (isinstance(self.gamma, (int, float)) and 0 <= self.gamma < 1):
      raise ValueError(
          f'gamma must be in [0, 1) (the weight of past contributions),'
          f' got {self.gamma!r}.')

  def update(self, assessment: Assessment) -> None:
    """Folds one round's assessment into the contributions."""
    for client, score in assessment.items():
      if not math.isfinite(score):
        raise ValueError(f'Assessment of client {client!r} is {score}.')
      if client in self.contributions:
        self.contributions[client] = (
            self.gamma * self.contributions[client]
            + (1 - self.gamma) * float(score))
      else:
        self.contributions[client] = float(score)
      self.rounds_assessed[client] = self.rounds_assessed.get(client, 0) + 1

  def to_json(self) -> dict[str, Any]:
    """State for a checkpoint (plain JSON types; floats round-trip)."""
    return dict(gamma=self.gamma, contributions=dict(self.contributions),
                rounds_assessed=dict(self.rounds_assessed))

  @classmethod
  def from_json(cls, state: Mapping[str, Any],
                gamma: float) -> 'ContributionTracker':
    """Restores `to_json`'s state; refuses one saved with another gamma."""
    if state.get('gamma') != gamma:
      raise ValueError(
          f'The saved contributions were tracked with gamma'
          f' {state.get("gamma")!r}, this run uses {gamma!r}: resume with'
          f' the saved value or start the run over.')
    return cls(gamma=gamma,
               contributions={k: float(v)
                              for k, v in state['contributions'].items()},
               rounds_assessed={k: int(v)
                                for k, v in state['rounds_assessed'].items()})


def normalized(
    contributions: Mapping[ClientId, float]) -> dict[ClientId, float]:
  """Contributions over the largest, in [0, 1]; negative ones count as 0.

  When no contribution is positive, nobody contributed more than anyone
  else: every client is a top contributor (1.0).
  """
  clipped = {i: max(0.0, float(c)) for i, c in contributions.items()}
  largest = max(clipped.values(), default=0.0)
  if largest <= 0:
    return {i: 1.0 for i in clipped}
  return {i: c / largest for i, c in clipped.items()}


def check_width_range(p_min: float, p_max: float) -> None:
  """Raises `ValueError` unless 0 < p_min <= p_max <= 1."""
  if not 0.0 < p_min <= 1.0 or not 0.0 < p_max <= 1.0:
    raise ValueError(
        f'Widths must be in (0, 1]; got p_min={p_min}, p_max={p_max}.')
  if p_min > p_max:
    raise ValueError(f'p_min={p_min} exceeds p_max={p_max}.')


def proportional_widths(contributions: Mapping[ClientId, float], *,
                        p_min: float, p_max: float,
                        exponent: float = 1.0) -> dict[ClientId, float]:
  """The default reward mechanism nu: width grows with normalized contribution.

  p_i = p_min + (p_max - p_min) * q_i ** exponent, with q_i the contribution
  over the largest (`normalized`). The top contributor(s) get p_max.

  Args:
    contributions: Client id -> contribution.
    p_min: Width of a client that contributed nothing.
    p_max: Width of the top contributor(s).
    exponent: > 0; above 1 favours strong contributors more.

  Returns:
    Client id -> maximum width the client may train and receive.
  """
  check_width_range(p_min, p_max)
  if not (math.isfinite(exponent) and exponent > 0):
    raise ValueError(f'exponent must be a finite number > 0, got {exponent!r}.')
  return {i: p_min + (p_max - p_min) * q**exponent
          for i, q in normalized(contributions).items()}
