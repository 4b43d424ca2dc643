"""Training-time Aequa in the driver: widths earned, bytes, exact resume."""

import csv
import json
import os

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from tests import tff_test_utils
from tests.training.recipes import recipe_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training import rewards


def _config(output_dir, **overrides):
  return recipe_test_utils.digits_config(output_dir, **{
      'algorithm': 'aequa_rewards', 'p_min': 0.25, 'contribution_gamma': 0.0,
      **overrides})


def _rows(output_dir):
  return recipe_test_utils.read_round_log(output_dir,
                                          'aequa_rewards_rounds.csv')


class WidestShortfallTest(absltest.TestCase):

  def test_flags_a_widest_model_clearly_below_a_narrower_one(self):
    widths = (0.25, 0.5, 0.75, 1.0)
    shortfall = rewards.widest_shortfall
    self.assertIsNone(shortfall(widths, (0.5, 0.6, 0.7, 0.8), 10_000))
    # 0.5 points on 10,000 examples: within the 1-point floor.
    self.assertIsNone(shortfall(widths, (0.5, 0.6, 0.805, 0.8), 10_000))
    self.assertEqual(shortfall(widths, (0.5, 0.7, 0.65, 0.6), 10_000),
                     (0.5, 0.7))
    # On 100 examples the shortfall must exceed two standard errors,
    # 2 sqrt(0.7 * 0.3 / 100) = 9.2 points: 10 points does, 8 does not.
    self.assertEqual(shortfall(widths, (0.5, 0.7, 0.65, 0.6), 100),
                     (0.5, 0.7))
    self.assertIsNone(shortfall(widths, (0.5, 0.7, 0.65, 0.62), 100))
    self.assertIsNone(shortfall(widths, (0.5, 0.7, 0.65, 0.6), 10_000,
                                min_gap=0.2))
    with self.assertRaisesRegex(ValueError, 'One accuracy per width'):
      shortfall(widths, (0.5,), 100)


class AequaRewardsTest(tff_test_utils.TffTestCase):

  def test_bad_settings_are_refused(self):
    out = self.create_tempdir().full_path
    for overrides, message in (
        (dict(contribution_gamma=1.0), r'gamma must be in \[0, 1\)'),
        (dict(contribution_assessment='shapley'),
         'Unknown contribution_assessment'),
        (dict(reward_exponent=0.0), 'reward_exponent must be'),
        (dict(p_min=0.5, p_max=0.4), 'p_min=0.5 exceeds p_max=0.4'),
        (dict(aggregator='robust'),
         '--aggregator=robust would be ignored: --algorithm=aequa_rewards'),
    ):
      with self.subTest(overrides), self.assertRaisesRegex(
          config_lib.ConfigError, message):
        _config(out, **overrides)
    with self.assertRaisesRegex(
        config_lib.ConfigError, '--contribution_gamma=0.3 is a setting of'
        ' --algorithm=aequa_rewards'):
      _config(out, algorithm='aequa', contribution_gamma=0.3,
              attack='none', malicious_fraction=0.0)

  def test_widths_follow_contributions_and_runs_resume_exactly(self):
    straight_dir = self.create_tempdir().full_path
    straight = driver.run(_config(straight_dir))
    rows = _rows(straight_dir)
    self.assertLen(rows, 3 * 4)
    (poisoned,) = straight.malicious
    by_round = {}
    for row in rows:
      by_round.setdefault(int(row['round']), {})[row['client']] = row
    # Everyone starts at p_max; the width a client trains in round r is
    # the one it earned in round r - 1.
    self.assertEqual({float(r['width']) for r in by_round[1].values()},
                     {1.0})
    for r in (2, 3):
      for cid, row in by_round[r].items():
        self.assertAlmostEqual(float(row['width']),
                               float(by_round[r - 1][cid]['next_width']))
    # The client training on random labels contributes least, from round 2
    # on, and earns the narrowest width; the top contributor earns p_max.
    for r in (2, 3):
      contributions = {cid: float(row['contribution'])
                       for cid, row in by_round[r].items()}
      self.assertEqual(min(contributions, key=contributions.get), poisoned)
      next_widths = [float(row['next_width'])
                     for row in by_round[r].values()]
      self.assertEqual(float(by_round[r][poisoned]['next_width']),
                       min(next_widths))
      self.assertAlmostEqual(max(next_widths), 1.0)
    # A narrower sub-network travels fewer bytes, both ways.
    last = by_round[3]
    narrow = min(last, key=lambda cid: float(last[cid]['width']))
    wide = max(last, key=lambda cid: float(last[cid]['width']))
    self.assertLess(float(last[narrow]['width']), float(last[wide]['width']))
    for field in ('bytes_sent', 'bytes_received'):
      self.assertLess(int(last[narrow][field]), int(last[wide][field]))
    self.assertIn('reward_width_min', straight.history[-1])
    self.assertCountEqual(straight.evaluations, ['global', 'aequa_rewards'])

    # Killed after round 2 (its checkpoint saved), resumed: the same.
    split_dir = self.create_tempdir().full_path
    driver.run(_config(split_dir, rounds=2))
    resumed = driver.run(_config(split_dir, common_test_evaluation=True))
    self.assertEqual(resumed.resumed_from_round, 2)
    self.assertEqual(_rows(split_dir), rows)
    for name in ('contributions/manifests/v3.json',):
      with open(os.path.join(straight_dir, name)) as f, open(
          os.path.join(split_dir, name)) as g:
        self.assertEqual(json.load(f), json.load(g))
    for kind in ('global', 'aequa_rewards'):
      np.testing.assert_allclose(
          [m.accuracy for m in resumed.evaluations[kind].values()],
          [m.accuracy for m in straight.evaluations[kind].values()])
    # On the common test set each client is measured at the width it
    # earned: a client at p_max scores what the global model scores, the
    # narrowest one something else.
    common = resumed.evaluations['aequa_rewards:common_test']
    global_common = resumed.evaluations['global:common_test']
    widths = {cid: float(row['next_width']) for cid, row in last.items()}
    for cid, width in widths.items():
      same = common[cid] == global_common[cid]
      self.assertEqual(same, width == 1.0, (cid, width))
    # The width-accuracy curve, p_min to p_max, on the common sets (here
    # the pooled validation and test splits): at p_max the global model.
    with open(os.path.join(split_dir, 'width_accuracy.csv')) as f:
      curve = list(csv.DictReader(f))
    np.testing.assert_allclose([float(r['width']) for r in curve],
                               np.linspace(0.25, 1.0, 10), atol=1e-6)
    self.assertAlmostEqual(float(curve[-1]['test_accuracy']),
                           next(iter(global_common.values())).accuracy,
                           places=6)
    on_grid = {float(r['width']): float(r['test_accuracy']) for r in curve}
    for cid, width in widths.items():
      for grid_width, accuracy in on_grid.items():
        if abs(width - grid_width) < 1e-9:
          self.assertAlmostEqual(common[cid].accuracy, accuracy, places=6)

  def test_leave_one_out_scores_each_client_against_the_others(self):
    # Round 1 trains every client at p_max from the same seeds, so both
    # runs have the same updates and only the assessment differs. Taking a
    # client's own share out of the direction it is scored against can
    # only lower its cosine.
    assessments = {}
    for assessment in ('cgsv', 'cgsv_leave_one_out'):
      out = self.create_tempdir().full_path
      run = driver.run(_config(out, rounds=1,
                               contribution_assessment=assessment))
      assessments[assessment] = {row['client']: float(row['assessment'])
                                 for row in _rows(out)}
    (poisoned,) = run.malicious
    included = assessments['cgsv']
    left_out = assessments['cgsv_leave_one_out']
    self.assertCountEqual(left_out, included)
    for cid in included:
      self.assertLess(left_out[cid], included[cid], cid)
    self.assertEqual(min(left_out, key=left_out.get), poisoned)


if __name__ == '__main__':
  tf.test.main()
