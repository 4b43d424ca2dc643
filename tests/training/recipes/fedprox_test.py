"""The FedProx recipe in the driver, and why it is not TFF 0.87's."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training import sampling
from tff_fair.training.recipes import registry


def _config(output_dir, **overrides):
  values = dict(
      dataset='digits', partition='dirichlet', alpha=0.5, num_clients=4,
      clients_per_round=4, rounds=2, batch_size=16, client_learning_rate=0.1,
      seed=7, output_dir=output_dir, eval_every=0)
  values.update(overrides)
  return registry.make_config(**values)


def _flat(weights):
  return np.concatenate([np.ravel(w) for w in weights.trainable])


class FedProxTest(tff_test_utils.TffTestCase):

  def test_bad_settings_are_refused(self):
    out = self.create_tempdir().full_path
    for mu in (-0.1, float('nan'), float('inf')):
      with self.subTest(mu=mu), self.assertRaisesRegex(
          config_lib.ConfigError, 'fedprox_mu must be a finite number >= 0'):
        _config(out, algorithm='fedprox', fedprox_mu=mu)
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        '--fedprox_mu=0.5 is a setting of --algorithm=fedprox'):
      _config(out, algorithm='fedavg', fedprox_mu=0.5)

  def _trained(self, **overrides):
    """(initial, trained) global weights of a 2-round run, flattened."""
    plan, experiment = driver.prepare(
        _config(self.create_tempdir().full_path, **overrides))
    plan.apply()
    trainer = driver.Trainer(experiment)
    state, _ = trainer._restore()
    state, history = trainer._run_rounds(state, 0)
    self.assertLen(history, 2)
    return (_flat(experiment.model_spec.initial_weights(7)),
            _flat(trainer.process.get_model_weights(state)))

  def test_mu_zero_is_fedavg_and_mu_holds_clients_near_the_start(self):
    initial, fedavg = self._trained(algorithm='fedavg')
    _, prox0 = self._trained(algorithm='fedprox', fedprox_mu=0.0)
    _, prox = self._trained(algorithm='fedprox', fedprox_mu=1.0)
    # With mu = 0 the proximal loop takes FedAvg's steps on the same batches.
    self.assertAllClose(prox0, fedavg, rtol=1e-6, atol=1e-7)
    # The proximal term holds each client near the round's global model, so
    # the global model moves less from where it started.
    moved, moved_prox = (np.linalg.norm(w - initial) for w in (fedavg, prox))
    self.assertLess(moved_prox, 0.9 * moved)

  def test_runs_end_to_end_with_an_update_attack_and_dp(self):
    result = driver.run(_config(
        self.create_tempdir().full_path, algorithm='fedprox',
        attack='model_replacement', malicious_fraction=0.25,
        aggregator='dp', dp_noise_multiplier=0.0))
    self.assertEqual(result.rounds_completed, 2)
    self.assertEqual(list(result.evaluations), ['global'])
    self.assertLen(result.malicious, 1)

  def test_tff_087_fed_prox_pushes_clients_away_from_the_global_model(self):
    # Why the recipe does not use tff.learning.algorithms.
    # build_weighted_fed_prox: its client step adds mu * (w^t - w) to the
    # gradient. If a TFF upgrade fixes the sign, this fails: switch to it.
    experiment = driver.build_experiment(
        _config(self.create_tempdir().full_path))
    ids = experiment.data.client_ids
    datasets = sampling.client_datasets(experiment, ids, 1, epochs=2)
    initial = experiment.model_spec.initial_weights(7)
    optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.1)

    def moved(process):
      state = process.set_model_weights(process.initialize(), initial)
      after = process.get_model_weights(process.next(state, datasets).state)
      return np.linalg.norm(_flat(after) - _flat(initial))

    model_fn = experiment.model_spec.model_fn
    fedavg = moved(tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, optimizer))
    prox = moved(tff.learning.algorithms.build_weighted_fed_prox(
        model_fn, 1.0, optimizer))
    self.assertGreater(prox, 1.05 * fedavg)


if __name__ == '__main__':
  tf.test.main()
