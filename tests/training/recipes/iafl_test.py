"""IAFL in the driver: contributions, sharing, own models, exact resume."""

import json
import os
from unittest import mock

import numpy as np
import tensorflow as tf

from tests import tff_test_utils
from tests.training.recipes import recipe_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training import run_context
from tff_fair.training.recipes import iafl


def _config(output_dir, **overrides):
  return recipe_test_utils.digits_config(
      output_dir, **{'algorithm': 'iafl', **overrides})


def _rows(output_dir):
  return recipe_test_utils.read_round_log(output_dir, 'iafl_rounds.csv')


class IaflTest(tff_test_utils.TffTestCase):

  def test_bad_settings_are_refused(self):
    out = self.create_tempdir().full_path
    for overrides, message in (
        (dict(iafl_kappa=1.5), r'iafl_kappa must be in \[0, 1\]'),
        (dict(iafl_reset_probability=-0.1),
         r'iafl_reset_probability must be in \[0, 1\]'),
        (dict(iafl_contribution='shapley'), 'Unknown iafl_contribution'),
        (dict(iafl_contribution='data_size', contributions_file='c.json'),
         'both give the contributions'),
        # Given contributions: no model is measured on the server's sets.
        (dict(contributions_file='c.json', server_held_out_examples=100),
         'iafl ignores --server_held_out_examples'),
    ):
      with self.subTest(overrides), self.assertRaisesRegex(
          config_lib.ConfigError, message):
        _config(out, **overrides)
    # Measured standalone contributions read them.
    _config(out, server_held_out_examples=100)

  def test_standalone_contributions_set_sharing_and_runs_resume_exactly(self):
    straight_dir = self.create_tempdir().full_path
    straight = driver.run(_config(straight_dir))
    rows = _rows(straight_dir)
    self.assertLen(rows, 3 * 4)
    (poisoned,) = straight.malicious
    contributions = {row['client']: float(row['contribution'])
                     for row in rows}
    # Measured once: every round logs the same contribution per client.
    for row in rows:
      self.assertEqual(float(row['contribution']),
                       contributions[row['client']])
    # Trained alone on random labels, the poisoned client is worst on the
    # common held-out data, so it receives the fewest others' updates:
    # k = ceil((p / p_max)^(1 - kappa) * 3) with kappa 0.5.
    self.assertEqual(min(contributions, key=contributions.get), poisoned)
    top = max(contributions.values())
    for row in rows:
      expected = int(np.ceil(
          (contributions[row['client']] / top)**0.5 * 3 - 1e-9))
      self.assertEqual(int(row['others_shared']), expected, row)
    shared = {row['client']: int(row['others_shared']) for row in rows}
    self.assertLess(shared[poisoned],
                    min(k for c, k in shared.items() if c != poisoned))
    self.assertCountEqual(straight.evaluations, ['global', 'personalized'])

    # Killed in round 3 (round 2's checkpoint saved), resumed: the
    # contributions are read back, not measured again, and the run ends
    # where the straight one did.
    split_dir = self.create_tempdir().full_path
    before_round = iafl.Iafl.before_round

    def killed_in_round_3(recipe, state, client_ids, round_num, datasets):
      if round_num == 3:
        raise recipe_test_utils.Killed()
      return before_round(recipe, state, client_ids, round_num, datasets)

    with mock.patch.object(iafl.Iafl, 'before_round', killed_in_round_3):
      with self.assertRaises(recipe_test_utils.Killed):
        driver.run(_config(split_dir))
    with mock.patch.object(run_context.RunContext,
                           'standalone_contributions') as measure:
      resumed = driver.run(_config(split_dir))
    measure.assert_not_called()
    self.assertEqual(resumed.resumed_from_round, 2)
    self.assertEqual(_rows(split_dir), rows)
    for kind in ('global', 'personalized'):
      np.testing.assert_allclose(
          [m.loss for m in resumed.evaluations[kind].values()],
          [m.loss for m in straight.evaluations[kind].values()], rtol=1e-5)
    with open(os.path.join(split_dir, 'iafl_contributions', 'manifests',
                           'v3.json')) as f:
      self.assertEqual(json.load(f)['value'], contributions)

  def test_contributions_file_replaces_standalone_training(self):
    out = self.create_tempdir().full_path
    given = {'client_0000': 0.9, 'client_0001': 0.05, 'client_0002': 0.3,
             'client_0003': 0.0}
    path = os.path.join(self.create_tempdir().full_path, 'contributions.json')
    with open(path, 'w') as f:
      json.dump(given, f)
    with mock.patch.object(run_context.RunContext,
                           'standalone_contributions') as measure:
      driver.run(_config(out, rounds=1, contributions_file=path))
    measure.assert_not_called()
    rows = _rows(out)
    self.assertEqual({row['client']: float(row['contribution'])
                      for row in rows}, given)
    # k = ceil((p / 0.9)^0.5 * 3): 3, ceil(0.71), ceil(1.73) and 0 (a zero
    # contribution receives no one's update).
    self.assertEqual({row['client']: int(row['others_shared'])
                      for row in rows},
                     {'client_0000': 3, 'client_0001': 1, 'client_0002': 2,
                      'client_0003': 0})

  def test_data_size_and_full_sharing(self):
    out = self.create_tempdir().full_path
    result = driver.run(_config(out, rounds=1, iafl_contribution='data_size',
                                iafl_kappa=1.0, attack='none',
                                malicious_fraction=0.0))
    del result
    rows = _rows(out)
    self.assertLen(rows, 4)
    for row in rows:
      # kappa 1: everyone receives every other update of the round.
      self.assertEqual(int(row['others_shared']), 3)
      self.assertGreater(float(row['contribution']), 100)  # Examples.


if __name__ == '__main__':
  tf.test.main()
