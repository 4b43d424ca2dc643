"""Contribution tracker, assessments and the width reward, by hand."""

import json
import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from tff_fair.fairness import contribution


class CosineToAggregateTest(absltest.TestCase):

  def test_hand_computed_cosines(self):
    # Unit updates (1,0) and (0,1), equal weights: aggregate (0.5, 0.5),
    # whose direction is 45 degrees from each.
    scores = contribution.cosine_to_aggregate(
        {'a': np.array([3.0, 0.0]), 'b': np.array([0.0, 0.5])})
    self.assertAlmostEqual(scores['a'], math.sqrt(0.5))
    self.assertAlmostEqual(scores['b'], math.sqrt(0.5))

  def test_weights_tilt_the_aggregate(self):
    # Weights 3:1 on (1,0) and (0,1): aggregate (0.75, 0.25).
    scores = contribution.cosine_to_aggregate(
        {'a': np.array([1.0, 0.0]), 'b': np.array([0.0, 1.0])},
        weights={'a': 3, 'b': 1})
    norm = math.hypot(0.75, 0.25)
    self.assertAlmostEqual(scores['a'], 0.75 / norm)
    self.assertAlmostEqual(scores['b'], 0.25 / norm)

  def test_scale_of_an_update_does_not_matter(self):
    rng = np.random.default_rng(0)
    updates = {i: rng.normal(size=50) for i in 'abc'}
    scaled = dict(updates, a=1000 * updates['a'])
    a = contribution.cosine_to_aggregate(updates)
    b = contribution.cosine_to_aggregate(scaled)
    for i in 'abc':
      self.assertAlmostEqual(a[i], b[i])

  def test_negated_aggregate_gets_the_lowest_contribution(self):
    rng = np.random.default_rng(1)
    direction = rng.normal(size=200)
    honest = {f'h{i}': direction + 0.5 * rng.normal(size=200)
              for i in range(4)}
    attacker = -np.mean(list(honest.values()), axis=0)
    for leave_one_out in (False, True):
      scores = contribution.cosine_to_aggregate(
          dict(honest, bad=attacker), leave_one_out=leave_one_out)
      self.assertEqual(min(scores, key=scores.get), 'bad')
      self.assertLess(scores['bad'], 0)
      self.assertGreater(min(scores[i] for i in honest), 0.5)

  def test_zero_update_scores_zero_and_cancelling_updates_score_zero(self):
    scores = contribution.cosine_to_aggregate(
        {'a': np.ones(3), 'zero': np.zeros(3)})
    self.assertEqual(scores['zero'], 0.0)
    self.assertAlmostEqual(scores['a'], 1.0)
    self.assertEqual(
        contribution.cosine_to_aggregate({'a': np.ones(3), 'b': -np.ones(3)}),
        {'a': 0.0, 'b': 0.0})

  def test_leave_one_out_by_hand(self):
    # Unit updates (1,0), (0,1), (1,0), equal weights. 'a' against b + c =
    # (1,1): cos 45 degrees; 'b' against a + c = (2,0): 0; 'c' as 'a'.
    scores = contribution.cosine_to_aggregate(
        {'a': np.array([2.0, 0.0]), 'b': np.array([0.0, 1.0]),
         'c': np.array([5.0, 0.0])}, leave_one_out=True)
    self.assertAlmostEqual(scores['a'], math.sqrt(0.5))
    self.assertAlmostEqual(scores['b'], 0.0)
    self.assertAlmostEqual(scores['c'], math.sqrt(0.5))

  def test_leave_one_out_matches_scoring_against_the_others(self):
    rng = np.random.default_rng(2)
    updates = {i: rng.normal(size=30) for i in 'abcd'}
    weights = {'a': 1.0, 'b': 2.0, 'c': 0.5, 'd': 3.0}
    scores = contribution.cosine_to_aggregate(updates, weights=weights,
                                              leave_one_out=True)
    units = {i: u / np.linalg.norm(u) for i, u in updates.items()}
    for i in updates:
      others = sum(weights[j] * units[j] for j in updates if j != i)
      self.assertAlmostEqual(
          scores[i], units[i] @ others / np.linalg.norm(others))

  def test_leave_one_out_stays_exact_beside_a_dominant_weight(self):
    # A client with 1e7 times the other's weight is scored against that
    # other alone: the cosine of the two, whatever the weights' scale.
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=50), rng.normal(size=50)
    scores = contribution.cosine_to_aggregate(
        {'a': a, 'b': b}, weights={'a': 1e7, 'b': 1.0}, leave_one_out=True)
    cosine = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    self.assertAlmostEqual(scores['a'], cosine, places=6)
    self.assertAlmostEqual(scores['b'], cosine, places=6)

  def test_an_unrelated_update_scores_zero_only_left_out(self):
    # Four honest updates near one axis, a free rider's along another: in
    # the aggregate its own share gives it a positive score; against the
    # others' aggregate it scores 0, as an unrelated direction should.
    rng = np.random.default_rng(0)
    honest = {f'h{i}': np.eye(400)[0] + 0.015 * rng.normal(size=400)
              for i in range(4)}
    updates = dict(honest, rider=np.eye(400)[1])
    included = contribution.cosine_to_aggregate(updates)
    left_out = contribution.cosine_to_aggregate(updates, leave_one_out=True)
    self.assertGreater(included['rider'], 0.15)
    self.assertLess(abs(left_out['rider']), 0.05)
    self.assertEqual(min(left_out, key=left_out.get), 'rider')
    for i in honest:
      self.assertGreater(left_out[i], 0.8)

  def test_leave_one_out_with_no_one_else_scores_zero(self):
    self.assertEqual(
        contribution.cosine_to_aggregate({'a': np.ones(3)},
                                         leave_one_out=True), {'a': 0.0})
    self.assertEqual(
        contribution.cosine_to_aggregate(
            {'a': np.ones(3), 'b': np.ones(3)}, weights={'a': 1, 'b': 0},
            leave_one_out=True), {'a': 0.0, 'b': 1.0})

  def test_bad_inputs_are_refused(self):
    with self.assertRaisesRegex(ValueError, 'at least one'):
      contribution.cosine_to_aggregate({})
    with self.assertRaisesRegex(ValueError, 'same number'):
      contribution.cosine_to_aggregate({'a': np.ones(2), 'b': np.ones(3)})
    with self.assertRaisesRegex(ValueError, 'No weight'):
      contribution.cosine_to_aggregate({'a': np.ones(2)}, weights={})
    with self.assertRaisesRegex(ValueError, 'not all 0'):
      contribution.cosine_to_aggregate({'a': np.ones(2)}, weights={'a': 0})


class DataSizeTest(absltest.TestCase):

  def test_share_of_the_largest(self):
    self.assertEqual(contribution.data_size({'a': 50, 'b': 200, 'c': 0}),
                     {'a': 0.25, 'b': 1.0, 'c': 0.0})

  def test_bad_counts_are_refused(self):
    for counts in ({}, {'a': 0}, {'a': 5, 'b': -1}):
      with self.assertRaises(ValueError, msg=str(counts)):
        contribution.data_size(counts)


class ContributionTrackerTest(parameterized.TestCase):

  def test_update_rule_by_hand(self):
    tracker = contribution.ContributionTracker(gamma=0.9)
    tracker.update({'a': 0.5, 'b': 1.0})  # First assessments taken as is.
    tracker.update({'a': 1.0})            # b is not assessed this round.
    tracker.update({'a': 0.0, 'b': 0.0})
    self.assertAlmostEqual(tracker.contributions['a'],
                           0.9 * (0.9 * 0.5 + 0.1 * 1.0) + 0.1 * 0.0)
    self.assertAlmostEqual(tracker.contributions['b'], 0.9 * 1.0)
    self.assertEqual(tracker.rounds_assessed, {'a': 3, 'b': 2})

  def test_gamma_zero_keeps_only_the_latest(self):
    tracker = contribution.ContributionTracker(gamma=0.0)
    tracker.update({'a': 0.3})
    tracker.update({'a': 0.7})
    self.assertEqual(tracker.contributions, {'a': 0.7})

  @parameterized.parameters(-0.1, 1.0, 1.5, float('nan'), '0.5')
  def test_bad_gamma_is_refused(self, gamma):
    with self.assertRaisesRegex(ValueError, 'gamma must be in'):
      contribution.ContributionTracker(gamma=gamma)

  def test_non_finite_assessment_is_refused(self):
    tracker = contribution.ContributionTracker(gamma=0.5)
    with self.assertRaisesRegex(ValueError, "client 'a'"):
      tracker.update({'a': float('nan')})

  def test_json_round_trip_is_exact(self):
    tracker = contribution.ContributionTracker(gamma=0.95)
    rng = np.random.default_rng(2)
    for _ in range(7):
      tracker.update({f'c{i}': float(rng.random()) for i in range(5)})
    restored = contribution.ContributionTracker.from_json(
        json.loads(json.dumps(tracker.to_json())), gamma=0.95)
    self.assertEqual(restored, tracker)
    # And it goes on exactly as the original.
    tracker.update({'c0': 0.25})
    restored.update({'c0': 0.25})
    self.assertEqual(restored.contributions, tracker.contributions)

  def test_state_of_another_gamma_is_refused(self):
    state = contribution.ContributionTracker(gamma=0.9).to_json()
    with self.assertRaisesRegex(ValueError, 'gamma 0.9.*uses 0.5'):
      contribution.ContributionTracker.from_json(state, gamma=0.5)


class ProportionalWidthsTest(parameterized.TestCase):

  def test_normalized_by_the_largest_with_negatives_at_zero(self):
    self.assertEqual(contribution.normalized({'a': 0.5, 'b': 2.0, 'c': -1}),
                     {'a': 0.25, 'b': 1.0, 'c': 0.0})
    self.assertEqual(contribution.normalized({'a': -1.0, 'b': 0.0}),
                     {'a': 1.0, 'b': 1.0})

  def test_linear_map_by_hand(self):
    widths = contribution.proportional_widths(
        {'top': 0.8, 'half': 0.4, 'none': -0.2}, p_min=0.2, p_max=1.0)
    self.assertAlmostEqual(widths['top'], 1.0)
    self.assertAlmostEqual(widths['half'], 0.6)
    self.assertAlmostEqual(widths['none'], 0.2)

  def test_exponent_widens_the_gap(self):
    contributions = {'top': 1.0, 'half': 0.5}
    linear = contribution.proportional_widths(contributions, p_min=0.1,
                                              p_max=0.9)
    squared = contribution.proportional_widths(contributions, p_min=0.1,
                                               p_max=0.9, exponent=2.0)
    self.assertAlmostEqual(squared['half'], 0.1 + 0.8 * 0.25)
    self.assertLess(squared['half'], linear['half'])
    self.assertAlmostEqual(squared['top'], 0.9)

  @parameterized.parameters((0.0, 1.0), (0.5, 1.1), (0.6, 0.5))
  def test_bad_width_range_is_refused(self, p_min, p_max):
    with self.assertRaisesRegex(ValueError, 'p_min'):
      contribution.proportional_widths({'a': 1.0}, p_min=p_min, p_max=p_max)

  @parameterized.parameters(0.0, -1.0, float('inf'))
  def test_bad_exponent_is_refused(self, exponent):
    with self.assertRaisesRegex(ValueError, 'exponent'):
      contribution.proportional_widths({'a': 1.0}, p_min=0.1, p_max=1.0,
                                       exponent=exponent)


if __name__ == '__main__':
  absltest.main()
