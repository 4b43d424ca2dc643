"""Tests of Aequa's width allocation: exact sweep, annealing, validation."""

import itertools
import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from tff_fair.fairness import allocation

# A realistic width-accuracy curve: 76 widths from 0.25 to 1, accuracy
# rising concavely from 0.5 to 0.9.
WIDTHS = np.linspace(0.25, 1.0, 76)
ACCURACIES = 0.5 + 0.4 * (1 - np.exp(-4 * (WIDTHS - 0.25) / 0.75)) / (
    1 - np.exp(-4))
# A curve small enough for brute force over four clients.
SMALL_WIDTHS = np.array([0.2, 0.4, 0.6, 0.8, 1.0])
SMALL_ACCURACIES = np.array([0.5, 0.6, 0.7, 0.8, 0.9])


def default_cost(gains: np.ndarray, eps: float = 1e-8) -> np.ndarray:
  """Var / (mean + eps) along the last axis, inf where inadmissible."""
  mean = gains.mean(axis=-1)
  denominator = mean + eps
  with np.errstate(divide='ignore', invalid='ignore'):
    return np.where(denominator > 0, gains.var(axis=-1) / denominator,
                    np.inf)


def brute_force(contributions, widths, accuracies, cost=default_cost,
                ir_margin=0.0):
  """Minimum cost over all K^N level choices that obey the IR rule."""
  c = np.asarray(contributions, dtype=np.float64)
  acc = np.asarray(accuracies, dtype=np.float64)
  thresholds = c + ir_margin
  choices = []
  for ti in thresholds:
    if ti <= acc.max():
      choices.append(np.flatnonzero(acc >= ti))
    else:  # IR-infeasible: the best model.
      choices.append(np.flatnonzero(acc == acc.max()))
  levels = np.array(list(itertools.product(*choices)))
  gains = acc[levels] - c
  if cost is default_cost:
    return float(np.min(default_cost(gains)))
  return min(float(cost(g)) for g in gains)


def contributions_for(kind: str, n: int, rng: np.random.Generator):
  if kind == 'spread':
    return rng.uniform(0.3, 0.85, n)
  if kind == 'bimodal':
    return np.where(rng.random(n) < 0.5, rng.normal(0.45, 0.02, n),
                    rng.normal(0.75, 0.02, n))
  if kind == 'clustered':
    return rng.normal(0.7, 0.005, n)
  raise ValueError(kind)


def random_tiny_instance(rng: np.random.Generator, kind: str):
  """N <= 5 clients, K <= 5 widths; ties and infeasible clients on purpose."""
  n = int(rng.integers(1, 6))
  k = int(rng.integers(1, 6))
  widths = np.sort(rng.choice(np.arange(1, 11) / 10, size=k, replace=False))
  if kind == 'continuous':
    accuracies = rng.uniform(0.4, 0.95, k)
    contributions = rng.uniform(0.3, 0.95, n)
  else:
    # On a coarse grid: tied accuracy levels (a non-monotone curve),
    # tied contributions, and coinciding sweep breakpoints.
    accuracies = rng.choice(np.arange(5, 10) / 10, size=k)
    contributions = rng.choice(np.arange(3, 10) / 10, size=n)
  if kind == 'infeasible':
    # Push one or two clients above the best model.
    above = rng.choice(n, size=min(n, int(rng.integers(1, 3))),
                       replace=False)
    contributions[above] = accuracies.max() + rng.choice([0.01, 0.1, 0.3])
  return contributions, widths, accuracies


class ExactSolverTest(parameterized.TestCase):

  @parameterized.parameters('continuous', 'grid', 'infeasible')
  def test_matches_brute_force(self, kind):
    rng = np.random.default_rng({'continuous': 0, 'grid': 1,
                                 'infeasible': 2}[kind])
    checked = 0
    for _ in range(400):
      c, w, acc = random_tiny_instance(rng, kind)
      expected = brute_force(c, w, acc)
      if math.isinf(expected):
        with self.assertRaisesRegex(ValueError, 'no admissible allocation'):
          allocation.solve_exact(c, w, acc)
        continue
      result = allocation.solve_exact(c, w, acc)
      checked += 1
      # Allocations may differ on ties; costs may not.
      self.assertAlmostEqual(result.cost, expected, delta=1e-12 + 1e-9 *
                             expected, msg=f'c={c} w={w} acc={acc}')
      # The reported allocation obeys the IR rule.
      best = acc.max()
      feasible = c <= best
      self.assertTrue(np.all(result.gain[feasible] >= 0))
      np.testing.assert_array_equal(result.accuracy[~feasible], best)
      self.assertEqual(result.ir_infeasible,
                       tuple(np.flatnonzero(~feasible)))
    # Some 'infeasible' instances have no admissible allocation at all.
    self.assertGreater(checked, 150)

  def test_matches_brute_force_with_ir_margins(self):
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(400):
      c, w, acc = random_tiny_instance(rng, 'continuous')
      margin = rng.uniform(0, 0.1, c.size)
      expected = brute_force(c, w, acc, ir_margin=margin)
      if math.isinf(expected):
        continue
      result = allocation.solve_exact(c, w, acc, ir_margin=margin)
      checked += 1
      self.assertAlmostEqual(result.cost, expected, delta=1e-12 + 1e-9 *
                             expected, msg=f'c={c} m={margin} acc={acc}')
      feasible = c + margin <= acc.max()
      # Every client IR can hold for clears its margin, not just 0.
      self.assertTrue(np.all(result.gain[feasible] >= margin[feasible]))
      self.assertEqual(result.ir_infeasible,
                       tuple(np.flatnonzero(~feasible)))
    self.assertGreater(checked, 150)

  def test_ir_margin_lifts_the_lowest_level(self):
    # c = 0.55 takes 0.6 without a margin; a 0.1 margin needs 0.7.
    for solver in ('exact', 'annealing'):
      plain = allocation.allocate([0.55, 0.85], SMALL_WIDTHS,
                                  SMALL_ACCURACIES, solver=solver)
      safe = allocation.allocate([0.55, 0.85], SMALL_WIDTHS,
                                 SMALL_ACCURACIES, solver=solver,
                                 ir_margin=0.1)
      self.assertEqual(plain.accuracy[0], 0.6)
      self.assertEqual(safe.accuracy[0], 0.7)
      # 0.85 + 0.1 is above the best model: it gets the best, flagged.
      self.assertEqual(safe.accuracy[1], 0.9)
      self.assertEqual(safe.ir_infeasible, (1,))
      self.assertEqual(plain.ir_infeasible, ())

  def test_result_fields_are_consistent(self):
    c = np.array([0.55, 0.6, 0.7, 0.95])
    result = allocation.solve_exact(c, WIDTHS, ACCURACIES)
    np.testing.assert_array_equal(result.width, WIDTHS[result.level])
    np.testing.assert_array_equal(result.accuracy, ACCURACIES[result.level])
    np.testing.assert_allclose(result.gain, result.accuracy - c)
    self.assertAlmostEqual(result.mean_gain, result.gain.mean())
    self.assertAlmostEqual(result.gain_variance, result.gain.var())
    self.assertAlmostEqual(
        result.cost, result.gain.var() / (result.gain.mean() + 1e-8))
    self.assertEqual(result.ir_infeasible, (3,))  # 0.95 > 0.9.
    self.assertEqual(result.solver, 'exact')
    self.assertEqual(result.cost_name, 'var_over_mean')
    self.assertEqual(result.num_clients, 4)
    self.assertGreater(result.stats['candidates'], 1)
    with self.assertRaises(ValueError):
      result.level[0] = 0  # Read-only.

  def test_equal_contributions_all_get_the_best_model(self):
    # Every common level has zero variance (cost 0); the tie-break keeps the
    # largest mean gain, i.e. the best model for everyone.
    result = allocation.solve_exact([0.6] * 5, WIDTHS, ACCURACIES)
    np.testing.assert_array_equal(result.level, [75] * 5)
    self.assertEqual(result.cost, 0.0)

  def test_is_monotone_in_contributions(self):
    c = contributions_for('spread', 300, np.random.default_rng(3))
    result = allocation.solve_exact(c, WIDTHS, ACCURACIES)
    order = np.argsort(c)
    self.assertTrue(np.all(np.diff(result.accuracy[order]) >= 0))

  @parameterized.parameters(0, 1, 2)
  def test_pearson_close_to_one_on_spread_contributions(self, seed):
    c = contributions_for('spread', 200, np.random.default_rng(seed))
    result = allocation.solve_exact(c, WIDTHS, ACCURACIES)
    self.assertGreaterEqual(np.corrcoef(result.accuracy, c)[0, 1], 0.95)

  def test_top_contributor_gets_best_model_on_a_fine_grid(self):
    # The paper's Lemma 3, with enough levels for it to hold.
    c = contributions_for('spread', 50, np.random.default_rng(4))
    result = allocation.solve_exact(c, WIDTHS, ACCURACIES)
    self.assertEqual(result.level[np.argmax(c)], 75)

  def test_non_monotone_curve_serves_narrowest_width_per_accuracy(self):
    widths = [0.25, 0.5, 0.75, 1.0]
    accuracies = [0.6, 0.8, 0.7, 0.8]  # 0.8 at 0.5 and 1.0.
    result = allocation.solve_exact([0.55, 0.75], widths, accuracies)
    # Equal gains 0.05 are possible: 0.6 and 0.8; 0.8 is served at 0.5.
    np.testing.assert_array_equal(result.level, [0, 1])
    np.testing.assert_allclose(result.width, [0.25, 0.5])
    self.assertAlmostEqual(result.cost, 0.0)

  def test_min_and_max_width_restrict_the_levels(self):
    c = contributions_for('spread', 40, np.random.default_rng(5))
    result = allocation.solve_exact(c, WIDTHS, ACCURACIES, min_width=0.5,
                                    max_width=0.9)
    self.assertTrue(np.all(result.width >= 0.5))
    self.assertTrue(np.all(result.width <= 0.9))
    # The same as solving on the restricted curve.
    allowed = (WIDTHS >= 0.5) & (WIDTHS <= 0.9)
    restricted = allocation.solve_exact(c, WIDTHS[allowed],
                                        ACCURACIES[allowed])
    np.testing.assert_array_equal(result.width, restricted.width)
    self.assertEqual(result.cost, restricted.cost)

  def test_clients_above_the_best_model_count_in_the_cost(self):
    # Client 2 cannot gain: it gets the best model (0.9) and gain -0.05.
    result = allocation.solve_exact([0.6, 0.7, 0.95], WIDTHS, ACCURACIES)
    self.assertEqual(result.ir_infeasible, (2,))
    self.assertEqual(result.level[2], 75)
    self.assertAlmostEqual(result.gain[2], -0.05)
    self.assertAlmostEqual(result.cost,
                           result.gain.var() / (result.gain.mean() + 1e-8))

  def test_no_admissible_allocation_raises(self):
    with self.assertRaisesRegex(ValueError, 'no admissible allocation'):
      allocation.solve_exact([0.95, 0.95, 0.88], WIDTHS, ACCURACIES)

  def test_eps_is_honoured(self):
    cost = allocation.VarianceOverMeanCost(eps=0.5)
    c = [0.5, 0.6, 0.68, 0.85]
    result = allocation.solve_exact(c, SMALL_WIDTHS, SMALL_ACCURACIES,
                                    cost=cost)
    self.assertAlmostEqual(
        result.cost,
        brute_force(c, SMALL_WIDTHS, SMALL_ACCURACIES,
                    cost=lambda g: g.var() / (g.mean() + 0.5)),
        delta=1e-12)

  @parameterized.named_parameters(
      ('function', lambda g: float(np.std(g) - np.mean(g))),
      ('subclass', type('Sub', (allocation.VarianceOverMeanCost,), {})()),
  )
  def test_refuses_other_costs(self, cost):
    with self.assertRaisesRegex(TypeError, 'only solves the default cost'):
      allocation.solve_exact([0.5, 0.6], WIDTHS, ACCURACIES, cost=cost)

  def test_bad_eps(self):
    with self.assertRaisesRegex(ValueError, 'eps'):
      allocation.VarianceOverMeanCost(eps=0.0)


class AnnealingTest(parameterized.TestCase):

  @parameterized.product(start=['common_gain', 'proportional'],
                         n=[5, 50, 200])
  def test_reaches_the_exact_cost_from_a_worse_start(self, start, n):
    # The chain itself works where the landscape is benign (spread
    # contributions). It starts away from the optimum (a start at the exact
    # optimum could only return it: the best state visited is kept).
    for seed in range(2):
      c = contributions_for('spread', n, np.random.default_rng(seed))
      exact = allocation.solve_exact(c, WIDTHS, ACCURACIES)
      annealed = allocation.solve_annealing(c, WIDTHS, ACCURACIES,
                                            iterations=20_000, seed=seed,
                                            start=start)
      self.assertEqual(annealed.stats['start'], start)
      self.assertGreater(annealed.stats['start_cost'], exact.cost * 1.05)
      self.assertGreater(annealed.stats['accepted'], 0)
      self.assertLessEqual(annealed.cost, exact.cost * 1.01)
      # The exact cost is the optimum: annealing cannot beat it.
      self.assertGreaterEqual(annealed.cost, exact.cost * (1 - 1e-9))

  def test_default_start_is_the_exact_optimum(self):
    c = contributions_for('bimodal', 50, np.random.default_rng(0))
    exact = allocation.solve_exact(c, WIDTHS, ACCURACIES)
    annealed = allocation.solve_annealing(c, WIDTHS, ACCURACIES,
                                          iterations=2_000)
    self.assertEqual(annealed.stats['start'], 'exact')
    self.assertAlmostEqual(annealed.stats['start_cost'], exact.cost,
                           delta=1e-12 * exact.cost)

  def test_without_exact_start_is_worse_on_clustered_contributions(self):
    # Why the sweep seeds the chain: from a proportional start, single-client
    # moves stay far above the optimum when contributions are clustered.
    for seed in range(3):
      c = contributions_for('clustered', 100, np.random.default_rng(seed))
      exact = allocation.solve_exact(c, WIDTHS, ACCURACIES)
      annealed = allocation.solve_annealing(
          c, WIDTHS, ACCURACIES, iterations=100_000, start='proportional',
          seed=seed)
      self.assertGreater(annealed.cost, 2 * exact.cost)
      # ... while the correlation looks fine.
      self.assertGreater(np.corrcoef(annealed.accuracy, c)[0, 1], 0.8)

  def test_same_seed_same_allocation(self):
    c = contributions_for('bimodal', 100, np.random.default_rng(7))
    runs = [
        allocation.solve_annealing(c, WIDTHS, ACCURACIES, iterations=30_000,
                                   seed=seed, start='proportional')
        for seed in (11, 11, 12)
    ]
    np.testing.assert_array_equal(runs[0].level, runs[1].level)
    self.assertEqual(runs[0].cost, runs[1].cost)
    self.assertEqual(runs[0].stats['accepted'], runs[1].stats['accepted'])
    self.assertNotEqual(runs[0].stats['accepted'], runs[2].stats['accepted'])

  def test_never_worse_than_its_start(self):
    c = contributions_for('spread', 30, np.random.default_rng(8))
    for start in ('exact', 'common_gain', 'proportional'):
      result = allocation.solve_annealing(c, WIDTHS, ACCURACIES,
                                          iterations=5_000, start=start)
      # Up to rounding: the chain compares one-pass costs.
      self.assertLessEqual(result.cost,
                           result.stats['start_cost'] * (1 + 1e-12))

  def test_zero_iterations_returns_the_start(self):
    c = contributions_for('spread', 30, np.random.default_rng(9))
    exact = allocation.solve_exact(c, WIDTHS, ACCURACIES)
    result = allocation.solve_annealing(c, WIDTHS, ACCURACIES, iterations=0)
    np.testing.assert_array_equal(result.level, exact.level)

  def test_infeasible_clients_keep_the_best_model(self):
    c = np.array([0.5, 0.6, 0.7, 0.92, 0.95])
    result = allocation.solve_annealing(c, WIDTHS, ACCURACIES,
                                        iterations=20_000,
                                        start='proportional')
    self.assertEqual(result.ir_infeasible, (3, 4))
    np.testing.assert_array_equal(result.level[3:], [75, 75])
    self.assertTrue(np.all(result.gain[:3] >= 0))

  @parameterized.named_parameters(
      # Any callable of the gains (O(N) per move).
      ('plain', lambda g: float(np.abs(g - np.median(g)).mean() - g.min())),
      # A moment cost: scored from running sums.
      ('moments', None),
  )
  def test_custom_cost_matches_brute_force(self, cost):
    if cost is None:
      cost = StdMinusHalfMean()
    rng = np.random.default_rng(10)
    for _ in range(5):
      c = rng.uniform(0.4, 0.9, 4)
      result = allocation.allocate(c, SMALL_WIDTHS, SMALL_ACCURACIES,
                                   solver='annealing', cost=cost,
                                   iterations=5_000, seed=0)
      self.assertEqual(result.stats['start'], 'common_gain')
      # The chain had to improve on its start to reach the optimum.
      self.assertGreater(result.stats['start_cost'], result.cost + 1e-6)
      self.assertTrue(np.all(result.gain >= 0))
      self.assertAlmostEqual(
          result.cost,
          brute_force(c, SMALL_WIDTHS, SMALL_ACCURACIES, cost=cost),
          delta=1e-12)

  def test_custom_cost_name_is_reported(self):
    result = allocation.solve_annealing([0.5, 0.6], WIDTHS, ACCURACIES,
                                        cost=StdMinusHalfMean(),
                                        iterations=100)
    self.assertEqual(result.cost_name, 'std_minus_half_mean')

  @parameterized.named_parameters(
      ('negative_iterations', dict(iterations=-1), 'iterations'),
      ('float_iterations', dict(iterations=1.5), 'iterations'),
      ('temperature', dict(initial_temperature=0.0), 'initial_temperature'),
      ('cooling', dict(cooling=1.5), 'cooling'),
      ('start', dict(start='random'), 'start'),
  )
  def test_bad_options(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      allocation.solve_annealing([0.5, 0.6], WIDTHS, ACCURACIES, **options)


class StdMinusHalfMean:
  """A custom `MomentCost`: std[u] - mean[u] / 2."""

  name = 'std_minus_half_mean'

  def __call__(self, gains):
    return float(np.std(gains) - np.mean(gains) / 2)

  def from_moments(self, count, sum_gains, sum_squares):
    mean = np.asarray(sum_gains) / count
    std = np.sqrt(np.maximum(np.asarray(sum_squares) / count - mean**2, 0))
    return std - mean / 2


class AllocateTest(parameterized.TestCase):

  def test_dispatches_to_both_solvers(self):
    c = contributions_for('spread', 10, np.random.default_rng(0))
    exact = allocation.allocate(c, WIDTHS, ACCURACIES)
    annealed = allocation.allocate(c, WIDTHS, ACCURACIES, solver='annealing',
                                   iterations=20_000, seed=3,
                                   start='proportional')
    self.assertEqual(exact.solver, 'exact')
    self.assertEqual(annealed.solver, 'annealing')
    self.assertGreater(annealed.stats['start_cost'], 1.5 * exact.cost)
    self.assertAlmostEqual(annealed.cost / exact.cost, 1.0, delta=1e-9)

  def test_exact_solver_refuses_a_custom_cost(self):
    with self.assertRaisesRegex(TypeError, "solver='annealing'"):
      allocation.allocate([0.5, 0.6], WIDTHS, ACCURACIES,
                          cost=StdMinusHalfMean())

  def test_single_width(self):
    result = allocation.allocate([0.3, 0.4], [1.0], [0.8])
    np.testing.assert_array_equal(result.level, [0, 0])

  @parameterized.named_parameters(
      ('empty_contributions', [], [0.5, 1.0], [0.6, 0.7], {}, 'non-empty'),
      ('nan_contribution', [0.5, np.nan], [0.5, 1.0], [0.6, 0.7], {}, 'NaN'),
      ('inf_contribution', [np.inf], [0.5, 1.0], [0.6, 0.7], {}, 'finite'),
      ('empty_curve', [0.5], [], [], {}, 'widths must be a non-empty'),
      ('length_mismatch', [0.5], [0.5, 1.0], [0.6], {}, 'same length'),
      ('width_zero', [0.5], [0.0, 1.0], [0.6, 0.7], {}, r'\(0, 1\]'),
      ('width_above_one', [0.5], [0.5, 1.5], [0.6, 0.7], {}, r'\(0, 1\]'),
      ('not_increasing', [0.5], [0.5, 0.5], [0.6, 0.7], {},
       'strictly increasing'),
      ('decreasing', [0.5], [1.0, 0.5], [0.6, 0.7], {},
       'strictly increasing'),
      ('nan_accuracy', [0.5], [0.5, 1.0], [0.6, np.nan], {}, 'accuracies'),
      ('matrix', [[0.5]], [0.5, 1.0], [0.6, 0.7], {}, '1-D'),
      ('p_min_above_p_max', [0.5], [0.5, 1.0], [0.6, 0.7],
       dict(min_width=0.8, max_width=0.6), 'above max_width'),
      ('no_width_in_range', [0.5], [0.5, 1.0], [0.6, 0.7],
       dict(min_width=0.6, max_width=0.9), 'no width'),
      ('unknown_solver', [0.5], [0.5, 1.0], [0.6, 0.7],
       dict(solver='greedy'), 'solver'),
      ('negative_margin', [0.5], [0.5, 1.0], [0.6, 0.7],
       dict(ir_margin=-0.01), 'ir_margin must be'),
      ('margin_per_client_mismatch', [0.5, 0.6], [0.5, 1.0], [0.6, 0.7],
       dict(ir_margin=[0.01]), 'one per contribution'),
      ('nan_margin', [0.5], [0.5, 1.0], [0.6, 0.7],
       dict(ir_margin=np.nan), 'ir_margin must be'),
      ('annealing_option_with_exact', [0.5], [0.5, 1.0], [0.6, 0.7],
       dict(iterations=10), "only apply to solver='annealing'"),
  )
  def test_bad_input(self, contributions, widths, accuracies, options,
                     message):
    with self.assertRaisesRegex(ValueError, message):
      allocation.allocate(contributions, widths, accuracies, **options)


if __name__ == '__main__':
  absltest.main()
