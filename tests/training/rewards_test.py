"""Tests of Aequa's IR margins (tff_fair.training.rewards.ir_margins)."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from tff_fair.fairness import allocation
from tff_fair.training import rewards


class IrMarginsTest(parameterized.TestCase):

  def test_one_sided_95_percent_on_two_estimates(self):
    margins = rewards.ir_margins(np.array([0.5, 0.9]), 600, 0.95,
                                 contributions_measured=True)
    np.testing.assert_allclose(
        margins, 1.6448536 * np.sqrt(2 * np.array([0.25, 0.09]) / 600),
        rtol=1e-6)

  def test_supplied_contributions_count_the_curve_only(self):
    measured = rewards.ir_margins(np.array([0.7]), 100, 0.9, True)
    supplied = rewards.ir_margins(np.array([0.7]), 100, 0.9, False)
    self.assertAlmostEqual(measured[0] / supplied[0], np.sqrt(2))

  def test_half_confidence_is_the_papers_rule(self):
    np.testing.assert_array_equal(
        rewards.ir_margins(np.array([0.2, 0.6]), 50, 0.5, True), [0, 0])

  def test_more_held_out_examples_narrow_the_margin(self):
    small, large = (rewards.ir_margins(np.array([0.6]), n, 0.95, True)[0]
                    for n in (600, 10_000))
    self.assertAlmostEqual(small / large, np.sqrt(10_000 / 600))

  def test_supplied_values_outside_zero_one_get_no_margin(self):
    # Not accuracies (e.g. a user's scores): the binomial noise is 0 there.
    np.testing.assert_array_equal(
        rewards.ir_margins(np.array([-0.5, 1.5]), 100, 0.95, False), [0, 0])

  @parameterized.parameters((0.49, 100), (1.0, 100), (0.95, 0))
  def test_bad_arguments(self, confidence, n):
    with self.assertRaises(ValueError):
      rewards.ir_margins(np.array([0.5]), n, confidence, True)

  def test_margins_keep_ir_on_unseen_data(self):
    # A rising curve and contributions, each measured on 600 held-out
    # examples. Without a margin the allocation clears each measured
    # contribution on the measured curve, and some rewards' true accuracy
    # falls short of the client's true contribution: the noise flattered
    # the width or understated the contribution. With 95% margins such
    # shortfalls become rare.
    rng = np.random.default_rng(0)
    widths = np.linspace(0.1, 1.0, 91)
    truth = np.linspace(0.55, 0.80, 91)
    c = np.array([0.6, 0.66, 0.7, 0.72])
    short_without, short_with = 0, 0
    for _ in range(200):
      held_out = rng.binomial(600, truth) / 600
      # The contributions' own estimates, on the same 600 examples; both
      # rules allocate on the same draws.
      c_hat = rng.binomial(600, c) / 600
      for confidence in (0.5, 0.95):
        margins = rewards.ir_margins(c, 600, confidence, True)
        result = allocation.allocate(c_hat, widths, held_out,
                                     ir_margin=margins)
        feasible = np.setdiff1d(np.arange(c.size), result.ir_infeasible)
        short = int(np.sum(truth[result.level][feasible] < c[feasible]))
        if confidence == 0.5:
          short_without += short
        else:
          short_with += short
    # 69 and 7 of the 800 rewards with this seed.
    self.assertGreater(short_without, 40)
    self.assertLess(short_with, short_without / 5)


if __name__ == '__main__':
  absltest.main()
