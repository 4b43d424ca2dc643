"""Runs with the DP aggregator report the privacy they bought, every round."""

import csv
import json
import os
from unittest import mock

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tff_fair.privacy import accounting
from tff_fair.training import driver
from tff_fair.training.recipes import registry


def _config(output_dir, **overrides):
  # 5 of 10 clients a round: noise below 0.5 (TFF's adaptive clipping).
  values = dict(
      dataset='digits', model='mlp', partition='homogeneous',
      num_clients=10, clients_per_round=5, rounds=3, batch_size=16,
      client_learning_rate=0.1,
      seed=3, output_dir=output_dir, eval_every=0, aggregator='dp',
      dp_noise_multiplier=0.4)
  values.update(overrides)
  return registry.make_config(**values)


class _Killed(Exception):
  """Stands for the process being killed."""


def _epsilons(output_dir):
  with open(os.path.join(output_dir, 'metrics.csv')) as f:
    return [float(row['dp_epsilon']) for row in csv.DictReader(f)]


class PrivacyTest(tff_test_utils.TffTestCase):

  def test_fedavg_and_ditto_release_epsilon_every_round(self):
    for algorithm in ('fedavg', 'ditto'):
      with self.subTest(algorithm):
        out = self.create_tempdir().full_path
        config = _config(out, algorithm=algorithm)
        self.assertAlmostEqual(config.dp_delta, 1 / 10**1.1)
        result = driver.run(config)
        expected = [accounting.epsilon(0.4, 5, 10, r, config.dp_delta)
                    for r in (1, 2, 3)]
        np.testing.assert_allclose(_epsilons(out), expected, rtol=1e-9)
        self.assertTrue(np.all(np.diff(expected) > 0))
        self.assertEqual([h['dp_epsilon'] for h in result.history], expected)
        with open(os.path.join(out, 'summary.json')) as f:
          privacy = json.load(f)['privacy']
        self.assertEqual(privacy['dp_epsilon'], expected[-1])
        self.assertEqual(privacy['dp_noise_multiplier'], 0.4)
        if algorithm == 'ditto':
          # Personal models (never sent, so not noised) of the sampled
          # clients, beside the private global model.
          self.assertNotEmpty(result.evaluations['personalized'])

  def test_a_killed_run_resumes_the_epsilon_series(self):
    straight = self.create_tempdir().full_path
    driver.run(_config(straight))
    # Killed in round 2 after its row (and epsilon) was released, before its
    # checkpoint was saved: the resumed run redoes round 2, neither
    # restarting the count nor counting round 2 twice.
    resumed = self.create_tempdir().full_path
    save = tff.program.FileProgramStateManager.save

    async def killed_before_saving_round_2(manager, state, version):
      if version == 2:
        raise _Killed()
      await save(manager, state, version)

    with mock.patch.object(tff.program.FileProgramStateManager, 'save',
                           killed_before_saving_round_2):
      with self.assertRaises(_Killed):
        driver.run(_config(resumed))
    self.assertLen(_epsilons(resumed), 2)
    result = driver.run(_config(resumed))
    self.assertEqual(result.resumed_from_round, 1)
    self.assertEqual(_epsilons(resumed), _epsilons(straight))

  def test_a_budget_chooses_the_noise_and_config_json_records_it(self):
    out = self.create_tempdir().full_path
    config = _config(out, dp_noise_multiplier=0.1, dp_target_epsilon=30.0)
    spent = accounting.epsilon(config.dp_noise_multiplier, 5, 10, 3,
                               config.dp_delta)
    self.assertBetween(spent, 0.98 * 30.0, 30.0)
    driver.run(config)
    with open(os.path.join(out, 'config.json')) as f:
      saved = json.load(f)
    self.assertEqual(saved['dp_noise_multiplier'], config.dp_noise_multiplier)
    self.assertEqual(saved['dp_target_epsilon'], 30.0)
    self.assertAlmostEqual(_epsilons(out)[-1], spent)


if __name__ == '__main__':
  tf.test.main()
