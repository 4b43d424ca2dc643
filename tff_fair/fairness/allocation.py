"""Width allocation for Aequa: which slimmable-model width each client gets.

Aequa rewards each client with a sub-network of a trained slimmable model
whose accuracy matches the client's contribution. Inputs are the clients'
contributions `c` (N,) (e.g. standalone accuracies) and the model's
width-accuracy curve: widths (K,) in (0, 1], strictly increasing, and the
accuracy of the trained model at each width. A client that receives accuracy
`a_i` gains `u_i = a_i - c_i`.

Cost (this project's reading of the paper; replaceable, see `AllocationCost`):

  f(a) = Var[u] / (mean[u] + eps),  Var the population variance (ddof=0),

minimized subject to individual rationality (IR), `u_i >= 0`, as a hard
constraint for every client for which it can hold. Low variance means gains
in line with contributions; a high mean means a worthwhile collaboration.

Rules the paper leaves open, decided here:

* Levels, not widths. The cost only sees accuracies, so the allocation is
  over the distinct accuracy values of the curve, sorted increasingly; the
  curve need not be monotone in width. When several widths share one
  accuracy value, the narrowest is served (same reward, cheaper model). A
  wider model that is less accurate than a narrower one is still a level of
  its own and may be served when its accuracy value is the one needed.
* IR-infeasible clients (`c_i + m_i` above the best accuracy on the
  curve) cannot be promised a gain: they receive the best (most accurate)
  model and never move; their gains (negative when `c_i` too is above the
  best accuracy) count in the cost. An allocation with `mean[u] + eps <= 0`
  is inadmissible (cost +inf); when even everyone-gets-the-best is
  inadmissible no allocation exists and `ValueError` is raised.
* IR is checked exactly: `a_i >= c_i + m_i` in floating point, no
  tolerance, where `m_i >= 0` is the caller's margin (`ir_margin`, 0 by
  default). A margin asks a level to clear a contribution by more than the
  noise of the curve it was read from, so IR still holds when the rewarded
  model is measured on other data (`tff_fair.training.rewards` derives it
  from the held-out set's size). Gains stay `a_i - c_i`.

Solvers:

* `solve_exact` (default cost only): for some shared target `tau`, the
  allocation giving each IR-feasible client the feasible accuracy nearest
  to `c_i + tau` is optimal (project notes, "Allocation can be solved
  exactly"). As `tau` grows, one client moves up one level at a time, at
  breakpoints `(v_j + v_{j+1}) / 2 - c_i`; the sweep sorts all breakpoints
  and replays the moves with running sums of `u` and `u^2`, scoring every
  intermediate allocation. O(NK log NK). Breakpoints that coincide are
  replayed one move at a time in (client index, level) order; scoring the
  ends of such a group suffices, since over the group the variance is
  concave and the mean linear in the gain added. Ties: costs within
  `_TIE_RTOL * cost + _TIE_ATOL` (1e-9, 1e-15) of the minimum count as
  equal (rounding of the running sums); among them the allocation with the
  largest mean gain (the latest in the sweep, largest `tau`) wins, so e.g.
  equal contributions all get the best model. Checked against brute force
  in the tests.
* `solve_annealing`: the paper's simulated annealing (single-client level
  moves, Metropolis acceptance, geometric cooling), for any cost. Single
  moves get trapped when contributions are clustered (many local minima
  along the common-target family: runs stay many times above the optimum
  while Pearson still looks fine), so with the default cost it starts from
  the exact optimum and returns the best allocation visited: it can only
  match the sweep, never lose to it. Other costs start from a monotone
  allocation (see `solve_annealing`).
"""

from collections.abc import Callable, Mapping
import dataclasses
import math
import types
from typing import Any, Optional, Protocol, Union, runtime_checkable

import numpy as np

from tff_fair.fairness import metrics as fairness_metrics

ArrayOrFloat = Union[np.ndarray, float]

# Relative and absolute tolerance under which two sweep costs count as tied.
# The sweep's centered running sums lose ~1e-16 relative per term; over ~1e6
# moves the costs they give are off by far less than this.
_TIE_RTOL = 1e-9
_TIE_ATOL = 1e-15

# Annealing defaults. Proposals: half are one-level steps up or down (fine
# moves near an optimum), half jump to a uniformly drawn feasible level (so
# the chain can cross a plateau in one move).
_NEIGHBOUR_MOVE_PROBABILITY = 0.5
# Without an explicit `cooling`, the temperature falls to this fraction of
# the initial one by the last iteration: the end of the run is greedy.
_FINAL_TEMPERATURE_RATIO = 1e-4
# Proposals sampled from the start state to set the initial temperature.
_TEMPERATURE_PROBES = 256
# Random numbers are drawn in blocks of this many iterations, and the
# running sums are recomputed from scratch between blocks (no drift).
_BLOCK = 65536

_STARTS = ('auto', 'exact', 'common_gain', 'proportional')


class AllocationCost(Protocol):
  """A cost to minimize over allocations; any callable of the gains works.

  A cost is called with the gains `u` (N,) of one allocation (IR is already
  enforced by the solver) and returns a float; `inf` marks an inadmissible
  allocation, never accepted. It must not modify `gains`.
  """

  def __call__(self, gains: np.ndarray) -> float:
    ...


@runtime_checkable
class MomentCost(Protocol):
  """A cost that depends on the gains only through N, sum(u) and sum(u^2).

  The annealer updates such a cost in O(1) per move from running sums (a
  plain `AllocationCost` costs O(N) per move). `from_moments` must accept
  numpy arrays for the sums (broadcasting) and agree with `__call__`.
  """

  def __call__(self, gains: np.ndarray) -> float:
    ...

  def from_moments(
      self, count: int, sum_gains: ArrayOrFloat, sum_squares: ArrayOrFloat
  ) -> ArrayOrFloat:
    ...


@dataclasses.dataclass(frozen=True)
class VarianceOverMeanCost:
  """The default cost, Var[u] / (mean[u] + eps); +inf if mean + eps <= 0.

  Attributes:
    eps: The paper's small constant against division by zero (> 0).
  """

  eps: float = 1e-8
  name: str = dataclasses.field(default='var_over_mean', init=False)

  def __post_init__(self):
    if not (math.isfinite(self.eps) and self.eps > 0):
      raise ValueError(f'eps must be finite and > 0; got {self.eps}.')

  def __call__(self, gains: np.ndarray) -> float:
    u = np.asarray(gains, dtype=np.float64)
    # Two-pass mean and variance: exact enough to report and to compare.
    denominator = u.mean() + self.eps
    if denominator <= 0:
      return math.inf
    return float(u.var() / denominator)

  def from_moments(
      self, count: int, sum_gains: ArrayOrFloat, sum_squares: ArrayOrFloat
  ) -> ArrayOrFloat:
    mean = np.asarray(sum_gains, dtype=np.float64) / count
    # One-pass variance can round below zero when all gains are equal.
    variance = np.maximum(
        np.asarray(sum_squares, dtype=np.float64) / count - mean * mean, 0.0)
    denominator = mean + self.eps
    with np.errstate(divide='ignore', invalid='ignore'):
      cost = np.where(denominator > 0, variance / denominator, np.inf)
    return cost if cost.ndim else float(cost)



class NoAdmissibleAllocation(ValueError):
  """Even giving every client the best model leaves mean gain + eps <= 0."""


@dataclasses.dataclass(frozen=True, eq=False)
class Allocation:
  """One width per client (arrays are read-only).

  Attributes:
    level: (N,) int, index into the caller's `widths` / `accuracies`.
    width: (N,) the width each client receives.
    accuracy: (N,) that width's accuracy, `a_i`.
    gain: (N,) `a_i - c_i`.
    cost: The cost of this allocation (under the cost it was solved for).
    mean_gain: Mean of `gain`.
    gain_variance: Population variance of `gain`.
    ir_infeasible: Clients with `c_i + m_i` (the contribution and its IR
      margin) above the best accuracy; they receive the best model, and
      their gains are below the margin, negative when `c_i` is above too.
    solver: 'exact' or 'annealing'.
    cost_name: The cost's `name` attribute, or its type/function name.
    stats: Solver details (e.g. candidates scored, iterations, temperature).
  """

  level: np.ndarray
  width: np.ndarray
  accuracy: np.ndarray
  gain: np.ndarray
  cost: float
  mean_gain: float
  gain_variance: float
  ir_infeasible: tuple[int, ...]
  solver: str
  cost_name: str
  stats: Mapping[str, Any] = dataclasses.field(
      default_factory=lambda: types.MappingProxyType({}))

  @property
  def num_clients(self) -> int:
    return int(self.level.size)


@dataclasses.dataclass(frozen=True)
class _Problem:
  """A validated instance, levels reduced to distinct accuracy values."""

  contributions: np.ndarray  # (N,) float64.
  widths: np.ndarray  # (K,) the caller's curve.
  accuracies: np.ndarray  # (K,)
  values: np.ndarray  # (M,) distinct accuracies, strictly increasing.
  curve_index: np.ndarray  # (M,) narrowest caller level with that value.
  lowest: np.ndarray  # (N,) lowest feasible value index; M - 1 if none.
  feasible: np.ndarray  # (N,) bool, IR can hold.

  @property
  def num_clients(self) -> int:
    return int(self.contributions.size)

  @property
  def num_values(self) -> int:
    return int(self.values.size)


def _prepare(
    contributions: Any,
    widths: Any,
    accuracies: Any,
    min_width: Optional[float],
    max_width: Optional[float],
    ir_margin: Any = 0.0,
) -> _Problem:
  """Validates the inputs and reduces the curve to accuracy levels."""
  c = fairness_metrics.as_vector(contributions, 'contributions')
  margin = np.asarray(ir_margin, dtype=np.float64)
  if margin.ndim == 0:
    margin = np.full(c.shape, float(margin))
  if margin.shape != c.shape or not np.isfinite(margin).all() or (
      margin < 0).any():
    raise ValueError(
        f'ir_margin must be one finite number >= 0, or one per contribution'
        f' ({c.size}); got {np.asarray(ir_margin).tolist()}.')
  w = fairness_metrics.as_vector(widths, 'widths')
  acc = fairness_metrics.as_vector(accuracies, 'accuracies')
  if acc.size != w.size:
    raise ValueError(
        f'widths and accuracies must have the same length (one accuracy per'
        f' width); got {w.size} widths and {acc.size} accuracies.')
  if (w <= 0).any() or (w > 1).any():
    raise ValueError(f'widths must lie in (0, 1]; got {w.tolist()}.')
  if (np.diff(w) <= 0).any():
    raise ValueError(f'widths must be strictly increasing; got {w.tolist()}.')
  lo = 0.0 if min_width is None else float(min_width)
  hi = 1.0 if max_width is None else float(max_width)
  if not (0 <= lo <= 1 and 0 < hi <= 1):
    raise ValueError(
        f'min_width must lie in [0, 1] and max_width in (0, 1]; got'
        f' {min_width}, {max_width}.')
  if lo > hi:
    raise ValueError(
        f'min_width (p_min) {lo} is above max_width (p_max) {hi}.')
  allowed = np.flatnonzero((w >= lo) & (w <= hi))
  if allowed.size == 0:
    raise ValueError(
        f'no width of the curve lies in [min_width, max_width] = [{lo}, {hi}];'
        f' widths are {w.tolist()}.')
  # Distinct accuracy values, each served by its narrowest width: np.unique
  # returns the first occurrence, and `allowed` is in increasing width.
  values, first = np.unique(acc[allowed], return_index=True)
  curve_index = allowed[first]
  # First level whose accuracy is >= c_i + m_i: the lowest IR-feasible one.
  lowest = np.searchsorted(values, c + margin, side='left')
  feasible = lowest < values.size
  lowest = np.where(feasible, lowest, values.size - 1)
  return _Problem(
      contributions=c, widths=w, accuracies=acc, values=values,
      curve_index=curve_index, lowest=lowest, feasible=feasible)


def _cost_name(cost: Any) -> str:
  name = getattr(cost, 'name', None)
  if isinstance(name, str):
    return name
  return getattr(cost, '__name__', type(cost).__name__)


def _is_default_cost(cost: Any) -> bool:
  # Exactly the default class: a subclass may change what is minimized.
  return type(cost) is VarianceOverMeanCost



def _finish(
    problem: _Problem,
    value_index: np.ndarray,
    cost: AllocationCost,
    solver: str,
    stats: Mapping[str, Any],
) -> Allocation:
  """Builds the `Allocation` for per-client indices into `problem.values`."""
  level = problem.curve_index[value_index]
  accuracy = problem.accuracies[level]
  gain = accuracy - problem.contributions
  arrays = [level, problem.widths[level].copy(), accuracy, gain]
  for a in arrays:
    a.setflags(write=False)
  return Allocation(
      level=arrays[0], width=arrays[1], accuracy=arrays[2], gain=arrays[3],
      cost=float(cost(gain)),
      mean_gain=float(gain.mean()),
      gain_variance=float(gain.var()),
      ir_infeasible=tuple(int(i) for i in np.flatnonzero(~problem.feasible)),
      solver=solver,
      cost_name=_cost_name(cost),
      stats=types.MappingProxyType(dict(stats)))


def _sweep(
    problem: _Problem, cost: VarianceOverMeanCost
) -> tuple[np.ndarray, int]:
  """The common-target sweep; returns value indices and candidates scored."""
  c, v = problem.contributions, problem.values
  n, m = problem.num_clients, problem.num_values
  # Every feasible client starts at its lowest feasible level (tau -> -inf);
  # infeasible clients sit at the top level throughout.
  moves_per_client = np.where(problem.feasible, m - 1 - problem.lowest, 0)
  total = int(moves_per_client.sum())
  client = np.repeat(np.arange(n), moves_per_client)
  first_move = np.cumsum(moves_per_client) - moves_per_client
  level = problem.lowest[client] + (
      np.arange(total) - np.repeat(first_move, moves_per_client))
  # Move (client, level) takes the client from v[level] to v[level + 1] and
  # happens when c + tau passes the midpoint of the two.
  midpoints = 0.5 * (v[:-1] + v[1:])
  tau = midpoints[level] - c[client]
  # Stable sort over moves listed by (client, level): coinciding breakpoints
  # replay in that order, and each client's moves stay in level order.
  order = np.argsort(tau, kind='stable')
  client = client[order]
  level = level[order]
  # Sums of gains centered on the paper's continuous optimum (everyone
  # gains what the top feasible contributor gains from the best model):
  # optimal gains sit near it, so the one-pass variance below does not
  # cancel catastrophically even when it is tiny (clustered contributions).
  shift = v[-1] - c[problem.feasible].max() if problem.feasible.any() else 0.0
  old_gain = v[level] - c[client] - shift
  new_gain = v[level + 1] - c[client] - shift
  start_gain = v[problem.lowest] - c - shift
  sum_gains = np.empty(total + 1)
  sum_gains[0] = start_gain.sum()
  np.cumsum(new_gain - old_gain, out=sum_gains[1:])
  sum_gains[1:] += sum_gains[0]
  sum_squares = np.empty(total + 1)
  sum_squares[0] = np.dot(start_gain, start_gain)
  np.cumsum((new_gain - old_gain) * (new_gain + old_gain),
            out=sum_squares[1:])
  sum_squares[1:] += sum_squares[0]
  centered_mean = sum_gains / n
  variance = np.maximum(sum_squares / n - centered_mean**2, 0.0)
  denominator = centered_mean + shift + cost.eps
  costs = np.full(total + 1, np.inf)
  admissible = denominator > 0
  costs[admissible] = variance[admissible] / denominator[admissible]
  best = float(costs.min())
  if not math.isfinite(best):
    # Only possible with IR-infeasible clients: the last candidate gives
    # everyone the best model, the largest mean gain there is.
    raise NoAdmissibleAllocation(
        f'no admissible allocation: {int((~problem.feasible).sum())} clients'
        f' have contributions above the best accuracy {v[-1]}, and even'
        f' giving every client the best model leaves a mean gain of'
        f' {centered_mean[-1] + shift:.6g} <= -eps = {-cost.eps}.')
  # Ties: the latest candidate within tolerance has the largest mean gain,
  # since every move raises one client's accuracy.
  tied = np.flatnonzero(costs <= best + _TIE_RTOL * best + _TIE_ATOL)
  chosen = int(tied[-1])
  moves = np.bincount(client[:chosen], minlength=n)
  return problem.lowest + moves, total + 1


def _default_or(cost: Optional[AllocationCost]) -> AllocationCost:
  if cost is None:
    return VarianceOverMeanCost()
  if not callable(cost):
    raise TypeError(f'cost must be callable on the gains; got {cost!r}.')
  return cost


def solve_exact(
    contributions: Any,
    widths: Any,
    accuracies: Any,
    *,
    cost: Optional[AllocationCost] = None,
    min_width: Optional[float] = None,
    max_width: Optional[float] = None,
    ir_margin: Any = 0.0,
) -> Allocation:
  """Optimal allocation for the default cost, by the common-target sweep.

  Args:
    contributions: (N,) finite contributions `c_i`.
    widths: (K,) widths in (0, 1], strictly increasing.
    accuracies: (K,) accuracy of the trained model at each width.
    cost: `None` or a `VarianceOverMeanCost` (to set `eps`); any other cost
      is refused, since the sweep's optimality proof holds only for it.
    min_width: Serve only widths >= this (the paper's p_min); `None`: all.
    max_width: Serve only widths <= this (p_max); `None`: all.
    ir_margin: `m_i >= 0`, one number or (N,): IR asks `a_i >= c_i + m_i`.

  Returns:
    An `Allocation` with `solver='exact'`; `stats['candidates']` is the
    number of allocations scored.

  Raises:
    ValueError: Bad inputs, or no admissible allocation.
    TypeError: A cost other than `VarianceOverMeanCost`.
  """
  cost = _default_or(cost)
  if not _is_default_cost(cost):
    raise TypeError(
        f'solve_exact only solves the default cost VarianceOverMeanCost'
        f' (Var[u] / (mean[u] + eps)); got {_cost_name(cost)}. Use'
        f" solve_annealing (allocate(..., solver='annealing')) for other"
        f' costs.')
  problem = _prepare(contributions, widths, accuracies, min_width, max_width,
                     ir_margin)
  value_index, candidates = _sweep(problem, cost)
  return _finish(problem, value_index, cost, 'exact',
                 {'candidates': candidates})


def _common_gain_start(problem: _Problem) -> np.ndarray:
  """The paper's continuous optimum snapped to the grid.

  With a continuum of accuracies the optimum is a_i = c_i + (best - c_top):
  everyone gains what the top feasible contributor gains from the best
  model. Each feasible client gets the feasible level nearest to that
  target (the lower one on a tie). Monotone in c.
  """
  v, c = problem.values, problem.contributions
  if not problem.feasible.any():
    return problem.lowest.copy()
  common = v[-1] - c[problem.feasible].max()
  target = c + common
  above = np.clip(np.searchsorted(v, target, side='left'), 0, v.size - 1)
  below = np.clip(above - 1, 0, v.size - 1)
  nearest = np.where(
      np.abs(v[below] - target) <= np.abs(v[above] - target), below, above)
  return np.maximum(nearest, problem.lowest)


def _proportional_start(problem: _Problem) -> np.ndarray:
  """Contributions mapped linearly onto the accuracy range, then snapped.

  Min-max normalized contributions scaled to [worst, best] accuracy (all to
  the best when contributions are equal), the nearest level, raised to the
  lowest feasible one. Monotone in c; the lowest contributor gets the
  worst model and the top feasible contributor the best.
  """
  v, c = problem.values, problem.contributions
  if not problem.feasible.any():
    return problem.lowest.copy()
  cf = c[problem.feasible]
  spread = cf.max() - cf.min()
  share = np.ones_like(c) if spread == 0 else (c - cf.min()) / spread
  target = v[0] + np.clip(share, 0, 1) * (v[-1] - v[0])
  nearest = np.abs(target[:, None] - v[None, :]).argmin(axis=1)
  return np.maximum(nearest, problem.lowest)


def _scalar_moment_cost(
    cost: MomentCost, count: int) -> Callable[[float, float], float]:
  """`cost.from_moments` for Python floats, fast for the default cost."""
  if not _is_default_cost(cost):
    return lambda s1, s2: float(cost.from_moments(count, s1, s2))
  eps = cost.eps
  inverse = 1.0 / count

  # Plain float arithmetic: numpy scalars cost ~10x more per call, and this
  # runs once per annealing iteration.
  def score(s1: float, s2: float) -> float:
    mean = s1 * inverse
    denominator = mean + eps
    if denominator <= 0:
      return math.inf
    variance = s2 * inverse - mean * mean
    return variance / denominator if variance > 0 else 0.0

  return score


def _anneal(
    problem: _Problem,
    cost: AllocationCost,
    start: np.ndarray,
    iterations: int,
    initial_temperature: Optional[float],
    cooling: Optional[float],
    rng: np.random.Generator,
) -> tuple[np.ndarray, dict[str, Any]]:
  """Metropolis chain over value indices; returns the best state visited."""
  v, c = problem.values, problem.contributions
  n, m = problem.num_clients, problem.num_values
  movable = np.flatnonzero(problem.feasible & (problem.lowest < m - 1))
  state = start.astype(np.int64).copy()
  gains = v[state] - c
  moments = isinstance(cost, MomentCost)

  def full_cost(gains: np.ndarray) -> float:
    if moments:
      return float(cost.from_moments(n, float(gains.sum()),
                                     float(gains @ gains)))
    return float(cost(gains))

  current = full_cost(gains)
  if not math.isfinite(current):
    # An inadmissible start (IR-infeasible clients dragging the mean gain
    # down): restart from everyone-gets-the-best, the largest mean gain.
    state = np.full(n, m - 1, dtype=np.int64)
    gains = v[state] - c
    current = full_cost(gains)
    if not math.isfinite(current):
      raise NoAdmissibleAllocation(
          f'no admissible allocation under {_cost_name(cost)}: even giving'
          f' every client the best model costs inf (mean gain'
          f' {gains.mean():.6g}; {int((~problem.feasible).sum())} clients'
          f' have contributions above the best accuracy {v[-1]}).')
  start = state.copy()
  # Reported as `Allocation.cost` is: from the gains, two-pass.
  stats: dict[str, Any] = {'iterations': iterations,
                           'start_cost': float(cost(gains))}
  if movable.size == 0 or iterations == 0:
    stats.update(accepted=0, best_iteration=0,
                 initial_temperature=0.0, cooling=1.0)
    return state, stats

  lowest = problem.lowest

  def propose(size: int) -> tuple[np.ndarray, ...]:
    """Clients and candidate levels; a step uses the client's level now."""
    who = movable[rng.integers(0, movable.size, size=size)]
    step = rng.random(size) < _NEIGHBOUR_MOVE_PROBABILITY
    direction = np.where(rng.random(size) < 0.5, -1, 1)
    span = m - lowest[who]
    jump = lowest[who] + np.minimum(
        (rng.random(size) * span).astype(np.int64), span - 1)
    # Step proposals are resolved against the live state in the loop; the
    # code 0 marks a jump whose target is in `jump`.
    return who, np.where(step, direction, 0), jump

  # Initial temperature: the median uphill change of a sample of proposals
  # from the start, so a typical uphill move is first accepted w.p. 1/e.
  if initial_temperature is None:
    who, step, jump = propose(_TEMPERATURE_PROBES)
    target = np.where(step != 0, state[who] + step, jump)
    ok = (target >= lowest[who]) & (target < m) & (target != state[who])
    who, target = who[ok], target[ok]
    new_gain = v[target] - c[who]
    s1 = gains.sum() + new_gain - gains[who]
    s2 = gains @ gains + new_gain**2 - gains[who]**2
    if moments:
      probe = np.asarray(cost.from_moments(n, s1, s2), dtype=np.float64)
    else:
      probe = np.empty(who.size)
      for k, (i, g) in enumerate(zip(who, new_gain)):
        old = gains[i]
        gains[i] = g
        probe[k] = cost(gains)
        gains[i] = old
    uphill = probe - current
    uphill = uphill[np.isfinite(uphill) & (uphill > 0)]
    initial_temperature = float(np.median(uphill)) if uphill.size else (
        1e-12 * max(1.0, abs(current)))
  if cooling is None:
    cooling = _FINAL_TEMPERATURE_RATIO ** (1.0 / max(iterations, 1))
  stats.update(initial_temperature=initial_temperature, cooling=cooling)

  values = v.tolist()
  contrib = c.tolist()
  levels = state.tolist()
  low = lowest.tolist()
  if moments:
    score = _scalar_moment_cost(cost, n)
  g = gains  # Kept current for plain costs only.
  best = current
  best_iteration = 0
  log_client: list[int] = []
  log_level: list[int] = []
  best_log_length = 0
  temperature = initial_temperature
  done = 0
  while done < iterations:
    size = min(_BLOCK, iterations - done)
    who, step, jump = propose(size)
    # Accept an uphill change d iff d <= T_t * -log(U), U ~ (0, 1]: the
    # Metropolis rule exp(-d / T_t) >= U without an exp per iteration.
    schedule = temperature * cooling ** np.arange(size)
    threshold = (schedule * -np.log1p(-rng.random(size))).tolist()
    temperature *= cooling**size
    if moments:
      # Fresh sums every block: no drift from long runs of updates.
      gains_now = v[levels] - c
      s1, s2 = float(gains_now.sum()), float(gains_now @ gains_now)
      current = score(s1, s2)
    for t, i, d, j in zip(range(size), who.tolist(), step.tolist(),
                          jump.tolist()):
      cur = levels[i]
      new = cur + d if d else j
      if new == cur or new < low[i] or new >= m:
        continue
      old_gain = values[cur] - contrib[i]
      new_gain = values[new] - contrib[i]
      if moments:
        n1 = s1 + new_gain - old_gain
        n2 = s2 + (new_gain - old_gain) * (new_gain + old_gain)
        proposal = score(n1, n2)
        if proposal - current > threshold[t]:
          continue
        s1 = n1
        s2 = n2
      else:
        g[i] = new_gain
        proposal = float(cost(g))
        if proposal - current > threshold[t]:
          g[i] = old_gain
          continue
      levels[i] = new
      current = proposal
      log_client.append(i)
      log_level.append(new)
      if proposal < best:
        best = proposal
        best_iteration = done + t + 1
        best_log_length = len(log_client)
    done += size
  accepted = len(log_client)
  # Replay the accepted moves up to the best state seen.
  best_state = start.astype(np.int64).copy()
  for i, new in zip(log_client[:best_log_length],
                    log_level[:best_log_length]):
    best_state[i] = new
  stats.update(accepted=accepted, best_iteration=best_iteration,
               final_cost=current)
  return best_state, stats


def solve_annealing(
    contributions: Any,
    widths: Any,
    accuracies: Any,
    *,
    cost: Optional[AllocationCost] = None,
    iterations: Optional[int] = None,
    initial_temperature: Optional[float] = None,
    cooling: Optional[float] = None,
    seed: Optional[int] = 0,
    start: str = 'auto',
    min_width: Optional[float] = None,
    max_width: Optional[float] = None,
    ir_margin: Any = 0.0,
) -> Allocation:
  """Simulated annealing over per-client levels, for any cost.

  Each iteration picks a uniformly random IR-feasible client and proposes a
  new feasible level for it: with probability 1/2 one level up or down,
  otherwise a uniformly drawn feasible level. The move is accepted with the
  Metropolis probability min(1, exp(-delta / T_t)), T_t = T_0 * cooling^t
  (geometric schedule, one step per iteration). The best allocation visited
  is returned, so the result is never worse than the start. IR-infeasible
  clients keep the best model. For a `MomentCost` (the default cost is one)
  a move is scored in O(1) from running sums of u and u^2; other costs are
  called on the whole gain vector, O(N) per move.

  Args:
    contributions: (N,) finite contributions `c_i`.
    widths: (K,) widths in (0, 1], strictly increasing.
    accuracies: (K,) accuracy of the trained model at each width.
    cost: The cost to minimize; `None` is `VarianceOverMeanCost()`.
    iterations: Number of proposals; `None`: max(200_000, 100 N).
    initial_temperature: T_0 > 0; `None`: the median cost increase of 256
      random uphill proposals from the start state.
    cooling: Factor in (0, 1] per iteration; `None`: the temperature falls
      to 1e-4 T_0 by the last iteration.
    seed: Seed for `np.random.default_rng`; same seed, same allocation.
    start: 'exact' (the optimum of the default cost: the annealer can then
      only polish it), 'common_gain' (everyone gains what the top
      contributor gains from the best model, snapped to the grid),
      'proportional' (contributions mapped linearly onto the accuracy
      range), or 'auto': 'exact' for the default cost, 'common_gain' for
      any other.
    min_width: Serve only widths >= this (p_min); `None`: all.
    max_width: Serve only widths <= this (p_max); `None`: all.
    ir_margin: `m_i >= 0`, one number or (N,): IR asks `a_i >= c_i + m_i`.

  Returns:
    An `Allocation` with `solver='annealing'` and the chain's details in
    `stats` (start, iterations, accepted, temperatures, start_cost).

  Raises:
    ValueError: Bad inputs or options, or no admissible allocation.
  """
  cost = _default_or(cost)
  problem = _prepare(contributions, widths, accuracies, min_width, max_width,
                     ir_margin)
  if iterations is None:
    iterations = max(200_000, 100 * problem.num_clients)
  if isinstance(iterations, bool) or not isinstance(
      iterations, (int, np.integer)) or iterations < 0:
    raise ValueError(f'iterations must be an int >= 0; got {iterations!r}.')
  if initial_temperature is not None and not (
      math.isfinite(initial_temperature) and initial_temperature > 0):
    raise ValueError(
        f'initial_temperature must be finite and > 0; got'
        f' {initial_temperature}.')
  if cooling is not None and not 0 < cooling <= 1:
    raise ValueError(f'cooling must lie in (0, 1]; got {cooling}.')
  if start not in _STARTS:
    raise ValueError(f'start must be one of {_STARTS}; got {start!r}.')
  if start == 'auto':
    start = 'exact' if _is_default_cost(cost) else 'common_gain'
  if start == 'exact':
    # The default cost's optimum; with another cost only a starting point.
    exact_cost = cost if _is_default_cost(cost) else VarianceOverMeanCost()
    initial, _ = _sweep(problem, exact_cost)
  elif start == 'common_gain':
    initial = _common_gain_start(problem)
  else:
    initial = _proportional_start(problem)
  rng = np.random.default_rng(seed)
  value_index, stats = _anneal(problem, cost, initial, int(iterations),
                               initial_temperature, cooling, rng)
  stats['start'] = start
  return _finish(problem, value_index, cost, 'annealing', stats)


def allocate(
    contributions: Any,
    widths: Any,
    accuracies: Any,
    *,
    solver: str = 'exact',
    cost: Optional[AllocationCost] = None,
    min_width: Optional[float] = None,
    max_width: Optional[float] = None,
    ir_margin: Any = 0.0,
    **annealing_options: Any,
) -> Allocation:
  """Allocates one width per client; the entry point.

  Args:
    contributions: (N,) finite contributions `c_i` (e.g. standalone
      accuracies).
    widths: (K,) widths in (0, 1], strictly increasing.
    accuracies: (K,) accuracy of the trained model at each width (need not
      be monotone).
    solver: 'exact' (`solve_exact`, default cost only) or 'annealing'
      (`solve_annealing`).
    cost: `None` for Var[u] / (mean[u] + eps), or any `AllocationCost`
      (annealing only).
    min_width: Serve only widths >= this (the paper's p_min).
    max_width: Serve only widths <= this (p_max).
    ir_margin: `m_i >= 0`, one number or (N,) (one per client): IR asks
      `a_i >= c_i + m_i`.
    **annealing_options: `iterations`, `initial_temperature`, `cooling`,
      `seed`, `start` for `solve_annealing`.

  Returns:
    An `Allocation`.

  Raises:
    ValueError: Bad inputs, an unknown solver, annealing options with the
      exact solver, or no admissible allocation.
    TypeError: A custom cost with the exact solver.
  """
  if solver == 'exact':
    if annealing_options:
      raise ValueError(
          f"options {sorted(annealing_options)} only apply to"
          f" solver='annealing'.")
    return solve_exact(contributions, widths, accuracies, cost=cost,
                       min_width=min_width, max_width=max_width,
                       ir_margin=ir_margin)
  if solver == 'annealing':
    return solve_annealing(contributions, widths, accuracies, cost=cost,
                           min_width=min_width, max_width=max_width,
                           ir_margin=ir_margin, **annealing_options)
  raise ValueError(f"solver must be 'exact' or 'annealing'; got {solver!r}.")
