"""Tests of the collaborative-fairness metrics against hand-computed values."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from tff_fair.fairness import metrics

# Gains u = a - c = [0.1, 0.1, 0.15, 0.1].
CONTRIBUTIONS = [0.5, 0.6, 0.7, 0.8]
ACCURACIES = [0.6, 0.7, 0.85, 0.9]


class PearsonTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('collinear', [1, 2, 3], [2, 4, 6], 1.0),
      ('anti', [1, 2, 3], [3, 2, 1], -1.0),
      # Centered: (-1, 0, 1) . (-1, 1, 0) = 1 over norms sqrt(2) sqrt(2).
      ('half', [1, 2, 3], [1, 3, 2], 0.5),
      ('uncorrelated', [1, 2, 3, 4], [1, -1, -1, 1], 0.0),
  )
  def test_hand_computed(self, x, y, expected):
    self.assertAlmostEqual(metrics.pearson_correlation(x, y), expected)

  def test_matches_numpy(self):
    rng = np.random.default_rng(0)
    x, y = rng.random(50), rng.random(50)
    self.assertAlmostEqual(metrics.pearson_correlation(x, y),
                           np.corrcoef(x, y)[0, 1])

  def test_stays_in_range_for_collinear_inputs(self):
    x = np.linspace(0.1, 0.9, 1001)
    self.assertLessEqual(metrics.pearson_correlation(x, 3 * x + 0.1), 1.0)

  @parameterized.named_parameters(
      ('constant_y', [0.5, 0.6, 0.7], [0.8, 0.8, 0.8]),
      ('constant_x', [0.5, 0.5], [0.6, 0.7]),
  )
  def test_constant_input_is_nan(self, x, y):
    self.assertTrue(math.isnan(metrics.pearson_correlation(x, y)))

  @parameterized.named_parameters(
      ('one_client', [0.5], [0.6], 'at least 2'),
      ('empty', [], [], 'non-empty'),
      ('mismatch', [0.5, 0.6], [0.6], 'one value per client'),
      ('nan', [0.5, np.nan], [0.6, 0.7], 'NaN'),
  )
  def test_bad_input(self, x, y, message):
    with self.assertRaisesRegex(ValueError, message):
      metrics.pearson_correlation(x, y)


class GainMetricsTest(parameterized.TestCase):

  def test_gains(self):
    np.testing.assert_allclose(
        metrics.gains(CONTRIBUTIONS, ACCURACIES), [0.1, 0.1, 0.15, 0.1])

  def test_mean_gain(self):
    self.assertAlmostEqual(metrics.mean_gain(CONTRIBUTIONS, ACCURACIES),
                           0.1125)

  def test_spread_is_max_minus_min(self):
    self.assertAlmostEqual(
        metrics.collaboration_gain_spread(CONTRIBUTIONS, ACCURACIES), 0.05)
    self.assertEqual(metrics.collaboration_gain_spread([0.5], [0.7]), 0.0)

  def test_ir_violations_count_strictly_negative_gains(self):
    # Gains -0.1, 0 (not a violation), +0.1, -0.05.
    self.assertEqual(
        metrics.ir_violations([0.5, 0.6, 0.6, 0.8], [0.4, 0.6, 0.7, 0.75]),
        2)

  @parameterized.named_parameters(
      ('mismatch', [0.5, 0.6], [0.6], 'one value per client'),
      ('inf', [0.5, np.inf], [0.6, 0.7], 'infinite'),
      ('matrix', [[0.5]], [[0.6]], '1-D'),
  )
  def test_bad_input(self, c, a, message):
    for metric in (metrics.gains, metrics.mean_gain,
                   metrics.collaboration_gain_spread, metrics.ir_violations,
                   metrics.fairness_report):
      with self.assertRaisesRegex(ValueError, message):
        metric(c, a)


class FairnessReportTest(absltest.TestCase):

  def test_hand_computed_report(self):
    report = metrics.fairness_report(CONTRIBUTIONS, ACCURACIES)
    self.assertEqual(report.num_clients, 4)
    # Centered a: (-0.1625, -0.0625, 0.0875, 0.1375); centered c:
    # (-0.15, -0.05, 0.05, 0.15); dot 0.0525, squared norms 0.056875, 0.05.
    self.assertAlmostEqual(report.pearson,
                           0.0525 / math.sqrt(0.056875 * 0.05))
    self.assertAlmostEqual(report.mean_gain, 0.1125)
    self.assertAlmostEqual(report.gain_spread, 0.05)
    # Deviations from 0.1125: three of -0.0125, one of 0.0375.
    self.assertAlmostEqual(report.gain_std,
                           math.sqrt((3 * 0.0125**2 + 0.0375**2) / 4))
    self.assertAlmostEqual(report.min_gain, 0.1)
    self.assertAlmostEqual(report.max_gain, 0.15)
    self.assertEqual(report.ir_violations, 0)

  def test_one_client_has_no_correlation(self):
    report = metrics.fairness_report([0.5], [0.4])
    self.assertTrue(math.isnan(report.pearson))
    self.assertEqual(report.ir_violations, 1)
    self.assertEqual(report.gain_spread, 0.0)

  def test_as_dict_prefixes_names(self):
    d = metrics.fairness_report(CONTRIBUTIONS, ACCURACIES).as_dict('f_')
    self.assertEqual(d['f_num_clients'], 4)
    self.assertAlmostEqual(d['f_mean_gain'], 0.1125)


if __name__ == '__main__':
  absltest.main()
