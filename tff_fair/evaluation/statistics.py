"""Summary statistics of a per-client metric (numpy only).

Fairness in federated learning is read off the distribution of a metric over
clients, not its mean alone; these are the statistics every tff_fair report
uses. Definitions:

* `mean`: unweighted mean over clients (each client counts once).
* `weighted_mean`: mean weighted by each client's number of examples.
* `variance`: population variance over clients (ddof=0), as in the Ditto
  paper's fairness measure.
* `worst_10_mean` / `best_10_mean`: mean of the ceil(10% of N) worst /
  best values (at least one client); for accuracy the worst are the lowest,
  for a loss (`higher_is_better=False`) the highest.
* `worst`: the single worst client's value (the lowest accuracy, the
  highest loss).
* `min` / `max`.
"""

from collections.abc import Sequence
import dataclasses
import math
from typing import Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class ClientStatistics:
  count: int
  mean: float
  weighted_mean: float
  variance: float
  worst_10_mean: float
  best_10_mean: float
  worst: float
  min: float
  max: float

  def as_dict(self, prefix: str = '') -> dict[str, float]:
    return {f'{prefix}{k}': v for k, v in dataclasses.asdict(self).items()}


def undefined(count: int) -> ClientStatistics:
  """The statistics of `count` values that have none (e.g. a diverged
  model's NaN losses): every statistic NaN."""
  nan = math.nan
  return ClientStatistics(count, nan, nan, nan, nan, nan, nan, nan, nan)


def tail_count(num_clients: int, fraction: float = 0.1) -> int:
  """How many clients a `fraction` tail holds: ceil(fraction * N), >= 1."""
  return max(1, math.ceil(fraction * num_clients - 1e-9))


def summarize(
    values: Sequence[float], weights: Optional[Sequence[float]] = None,
    higher_is_better: bool = True,
) -> ClientStatistics:
  """Statistics of one metric over clients.

  Args:
    values: The metric, one value per client.
    weights: Non-negative weights (e.g. test examples per client) for
      `weighted_mean`; `None` weighs clients equally.
    higher_is_better: False for losses: the worst tail is then the highest.

  Returns:
    A `ClientStatistics`.

  Raises:
    ValueError: If `values` is empty, has NaN, or weights do not match.
  """
  v = np.asarray(values, dtype=np.float64)
  if v.ndim != 1 or v.size == 0:
    raise ValueError('summarize() needs a non-empty 1-D sequence of values.')
  if np.isnan(v).any():
    raise ValueError(
        f'{int(np.isnan(v).sum())} of {v.size} client values are NaN; a'
        ' client with no test examples has no accuracy: drop it first.'
    )
  if weights is None:
    w = np.ones_like(v)
  else:
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != v.shape or (w < 0).any() or w.sum() <= 0:
      raise ValueError(
          'weights must be non-negative, one per value, and not all zero;'
          f' got shape {w.shape} for {v.size} values.'
      )
  ordered = np.sort(v)
  k = tail_count(v.size)
  low, high = float(ordered[:k].mean()), float(ordered[-k:].mean())
  worst, best = (low, high) if higher_is_better else (high, low)
  return ClientStatistics(
      count=int(v.size),
      mean=float(v.mean()),
      weighted_mean=float(np.sum(v * w) / np.sum(w)),
      variance=float(v.var()),
      worst_10_mean=worst,
      best_10_mean=best,
      worst=float(ordered[0] if higher_is_better else ordered[-1]),
      min=float(ordered[0]),
      max=float(ordered[-1]),
  )


def mean_min_max(name: str, values: Sequence[float]) -> dict[str, float]:
  """`<name>_mean`, `<name>_min` and `<name>_max` over clients' values."""
  stats = summarize(values)
  return {f'{name}_mean': stats.mean, f'{name}_min': stats.min,
          f'{name}_max': stats.max}
