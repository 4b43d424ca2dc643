"""Tests of the per-client summary statistics against hand-computed values."""

from absl.testing import absltest
from absl.testing import parameterized

from tff_fair.evaluation import statistics


class SummarizeTest(parameterized.TestCase):

  def test_hand_computed_values(self):
    # 10 clients: the 10% tails hold exactly one client each.
    values = [0.5, 0.9, 0.7, 0.6, 0.8, 0.4, 1.0, 0.3, 0.2, 0.1]
    weights = [1, 1, 1, 1, 1, 1, 1, 1, 1, 11]
    s = statistics.summarize(values, weights)
    self.assertEqual(s.count, 10)
    self.assertAlmostEqual(s.mean, 0.55)
    # (sum of values except 0.1) + 11 * 0.1 = 5.4 + 1.1 = 6.5 over 20.
    self.assertAlmostEqual(s.weighted_mean, 6.5 / 20)
    # Population variance: mean of squares 0.385 minus 0.55^2.
    self.assertAlmostEqual(s.variance, 0.385 - 0.3025)
    self.assertAlmostEqual(s.worst_10_mean, 0.1)
    self.assertAlmostEqual(s.best_10_mean, 1.0)
    self.assertAlmostEqual(s.worst, 0.1)
    self.assertAlmostEqual(s.min, 0.1)
    self.assertAlmostEqual(s.max, 1.0)

  @parameterized.parameters((1, 1), (9, 1), (10, 1), (11, 2), (20, 2),
                            (21, 3), (100, 10))
  def test_tail_count_is_ceil_of_ten_percent(self, n, expected):
    self.assertEqual(statistics.tail_count(n), expected)

  def test_worst_tail_averages_lowest_clients(self):
    values = [float(v) for v in range(20)]  # tail of 2 clients.
    s = statistics.summarize(values)
    self.assertAlmostEqual(s.worst_10_mean, 0.5)
    self.assertAlmostEqual(s.best_10_mean, 18.5)
    self.assertAlmostEqual(s.weighted_mean, s.mean)

  def test_worst_loss_is_the_highest(self):
    s = statistics.summarize([0.5, 2.0, 1.0], higher_is_better=False)
    self.assertAlmostEqual(s.worst_10_mean, 2.0)
    self.assertAlmostEqual(s.best_10_mean, 0.5)
    self.assertAlmostEqual(s.worst, 2.0)  # Not the minimum, as for accuracy.
    self.assertAlmostEqual(s.min, 0.5)

  def test_as_dict_prefixes_names(self):
    d = statistics.summarize([1.0, 3.0]).as_dict('acc_')
    self.assertEqual(d['acc_mean'], 2.0)
    self.assertEqual(d['acc_variance'], 1.0)

  @parameterized.named_parameters(
      ('empty', [], None, 'non-empty'),
      ('nan', [0.5, float('nan')], None, 'NaN'),
      ('weights_shape', [0.5, 0.6], [1.0], 'weights'),
      ('negative_weight', [0.5, 0.6], [1.0, -1.0], 'weights'),
      ('zero_weights', [0.5, 0.6], [0.0, 0.0], 'weights'),
  )
  def test_bad_input(self, values, weights, message):
    with self.assertRaisesRegex(ValueError, message):
      statistics.summarize(values, weights)


if __name__ == '__main__':
  absltest.main()
