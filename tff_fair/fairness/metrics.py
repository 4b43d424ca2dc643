"""Collaborative-fairness metrics over clients (numpy only).

Given each client's contribution `c_i` (standalone accuracy as a surrogate,
as in IAFL and Aequa) and the accuracy `a_i` of the model it ends up with,
the collaboration gain is `u_i = a_i - c_i`. Definitions:

* `pearson_correlation(a, c)`: Pearson's r between final accuracy and
  contribution (higher is fairer: rewards follow contributions). Undefined
  when either vector is constant; this module returns NaN then (as
  scipy.stats.pearsonr does), so a homogeneous split shows as "n/a" in a
  table rather than aborting a report.
* `mean_gain`: mean of `u` over clients (the papers' mean collaboration
  gain).
* `collaboration_gain_spread`: max(u) - min(u), the range of the gains
  (lower is fairer: nobody gains much more than anyone else). The Aequa
  text available to this project names the metric without a formula, so
  `fairness_report` also gives the population standard deviation of `u`
  (`gain_std`); state which one a table uses.
* `ir_violations`: clients with `u_i < 0` (worse off than alone), i.e.
  individual rationality violated.
"""

import dataclasses
import math
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class FairnessReport:
  """Fairness of one outcome; see the module docstring for definitions.

  Attributes:
    num_clients: N.
    pearson: Pearson's r of accuracies vs contributions; NaN if either is
      constant.
    mean_gain: Mean of `u = a - c`.
    gain_spread: max(u) - min(u).
    gain_std: Population standard deviation of u (ddof=0).
    min_gain: min(u).
    max_gain: max(u).
    ir_violations: Number of clients with u_i < 0.
  """

  num_clients: int
  pearson: float
  mean_gain: float
  gain_spread: float
  gain_std: float
  min_gain: float
  max_gain: float
  ir_violations: int

  def as_dict(self, prefix: str = '') -> dict[str, float]:
    return {f'{prefix}{k}': v for k, v in dataclasses.asdict(self).items()}


def as_vector(x: Any, name: str) -> np.ndarray:
  """`x` as a finite, non-empty float64 vector, or a `ValueError` naming it."""
  try:
    v = np.asarray(x, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(f'{name} must be a 1-D sequence of numbers: {e}') from e
  if v.ndim != 1 or v.size == 0:
    raise ValueError(
        f'{name} must be a non-empty 1-D sequence; got shape {v.shape}.')
  bad = ~np.isfinite(v)
  if bad.any():
    raise ValueError(
        f'{name} must be finite; {int(bad.sum())} of {v.size} values are NaN'
        f' or infinite (first at index {int(np.argmax(bad))}).')
  return v


def _pair(
    first: Any, second: Any, names: tuple[str, str] = ('contributions',
                                                        'accuracies')
) -> tuple[np.ndarray, np.ndarray]:
  a = as_vector(first, names[0])
  b = as_vector(second, names[1])
  if a.shape != b.shape:
    raise ValueError(
        f'{names[0]} and {names[1]} must have one value per client each;'
        f' got {a.size} and {b.size}.')
  return a, b


def gains(contributions: Any, accuracies: Any) -> np.ndarray:
  """Collaboration gains `u_i = accuracies_i - contributions_i`."""
  c, a = _pair(contributions, accuracies)
  return a - c


def pearson_correlation(x: Any, y: Any) -> float:
  """Pearson's correlation coefficient of two per-client vectors.

  Args:
    x: (N,) finite values, N >= 2.
    y: (N,) finite values.

  Returns:
    r in [-1, 1]; NaN when all values of `x`, or of `y`, are equal (zero
    variance), where the coefficient is undefined.

  Raises:
    ValueError: Fewer than 2 clients, non-finite values, length mismatch.
  """
  x, y = _pair(x, y, ('x', 'y'))
  if x.size < 2:
    raise ValueError(
        f'Pearson correlation needs at least 2 clients; got {x.size}.')
  # Constant means all values equal, tested exactly: the centered vector
  # of e.g. three 0.8s is not exactly zero (the mean rounds).
  if np.ptp(x) == 0 or np.ptp(y) == 0:
    return math.nan
  dx, dy = x - x.mean(), y - y.mean()
  norm = math.sqrt(float(dx @ dx) * float(dy @ dy))
  if norm == 0:  # Underflow of tiny but unequal values.
    return math.nan
  # Rounding can push |r| a hair above 1 for (anti)collinear inputs.
  return float(np.clip(float(dx @ dy) / norm, -1.0, 1.0))


def mean_gain(contributions: Any, accuracies: Any) -> float:
  """Mean collaboration gain, mean(a - c)."""
  return float(gains(contributions, accuracies).mean())


def collaboration_gain_spread(contributions: Any, accuracies: Any) -> float:
  """Collaboration gain spread, max(a - c) - min(a - c) (0 for one client)."""
  u = gains(contributions, accuracies)
  return float(u.max() - u.min())


def ir_violations(contributions: Any, accuracies: Any) -> int:
  """Number of clients worse off than alone: a_i < c_i (no tolerance)."""
  return int(np.sum(gains(contributions, accuracies) < 0))


def fairness_report(contributions: Any, accuracies: Any) -> FairnessReport:
  """All the metrics above for one outcome.

  Args:
    contributions: (N,) contributions (e.g. standalone accuracies).
    accuracies: (N,) accuracy of each client's final model.

  Returns:
    A `FairnessReport`; `pearson` is NaN for one client or constant inputs.

  Raises:
    ValueError: Empty or non-finite inputs, or length mismatch.
  """
  c, a = _pair(contributions, accuracies)
  u = a - c
  return FairnessReport(
      num_clients=int(c.size),
      pearson=pearson_correlation(a, c) if c.size >= 2 else math.nan,
      mean_gain=float(u.mean()),
      gain_spread=float(u.max() - u.min()),
      gain_std=float(u.std()),
      min_gain=float(u.min()),
      max_gain=float(u.max()),
      ir_violations=int(np.sum(u < 0)),
  )
