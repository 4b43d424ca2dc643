"""CGSV in the driver: reputations, rewards, own models, exact resume."""

import os

import numpy as np
import tensorflow as tf

from tests import tff_test_utils
from tests.training.recipes import recipe_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import driver


def _config(output_dir, **overrides):
  return recipe_test_utils.digits_config(
      output_dir, **{'algorithm': 'cgsv', **overrides})


def _rows(output_dir):
  return recipe_test_utils.read_round_log(output_dir, 'cgsv_rounds.csv')


class CgsvTest(tff_test_utils.TffTestCase):

  def test_bad_settings_are_refused(self):
    out = self.create_tempdir().full_path
    for overrides, message in (
        (dict(cgsv_alpha=1.5), r'cgsv_alpha must be in \[0, 1\]'),
        (dict(cgsv_beta=0.0), 'cgsv_beta must be a finite number > 0'),
        (dict(cgsv_norm=float('nan')), 'cgsv_norm must be a finite'),
    ):
      with self.subTest(overrides), self.assertRaisesRegex(
          config_lib.ConfigError, message):
        _config(out, **overrides)
    with self.assertRaisesRegex(config_lib.ConfigError,
                                '--cgsv_beta=2.0 is a setting of'
                                ' --algorithm=cgsv'):
      _config(out, algorithm='fedavg', cgsv_beta=2.0)

  def test_poisoned_client_earns_least_and_runs_resume_exactly(self):
    straight_dir = self.create_tempdir().full_path
    straight = driver.run(_config(straight_dir))
    rows = _rows(straight_dir)
    self.assertLen(rows, 3 * 4)
    (poisoned,) = straight.malicious
    for r in (1, 2, 3):
      of_round = {row['client']: row for row in rows
                  if int(row['round']) == r}
      shares = {cid: float(row['reward_share'])
                for cid, row in of_round.items()}
      reputations = {cid: float(row['reputation'])
                     for cid, row in of_round.items()}
      # Random labels point its update away from the others': the lowest
      # cosine, reputation and share; the top client gets the whole
      # aggregate.
      self.assertEqual(min(reputations, key=reputations.get), poisoned)
      self.assertEqual(min(shares, key=shares.get), poisoned)
      self.assertLess(shares[poisoned], 0.9)
      self.assertAlmostEqual(max(shares.values()), 1.0, places=6)
      self.assertAlmostEqual(sum(reputations.values()), 1.0, places=5)
    self.assertCountEqual(straight.evaluations, ['global', 'personalized'])
    self.assertLen(straight.evaluations['personalized'], 4)
    # Each client keeps the model it was rewarded with: the poisoned
    # client's, built from a sparsified aggregate, is not the global model.
    self.assertNotAlmostEqual(
        straight.evaluations['personalized'][poisoned].loss,
        straight.evaluations['global'][poisoned].loss, places=4)

    # Killed after round 2 (its checkpoint saved), resumed: the same.
    split_dir = self.create_tempdir().full_path
    driver.run(_config(split_dir, rounds=2))
    resumed = driver.run(_config(split_dir))
    self.assertEqual(resumed.resumed_from_round, 2)
    for a, b in zip(_rows(split_dir), rows):
      for field in ('phi', 'reputation', 'reward_share'):
        self.assertAlmostEqual(float(a[field]), float(b[field]), places=5)
    for kind in ('global', 'personalized'):
      np.testing.assert_allclose(
          [m.loss for m in resumed.evaluations[kind].values()],
          [m.loss for m in straight.evaluations[kind].values()], rtol=1e-5)


if __name__ == '__main__':
  tf.test.main()
