"""Per-FedAvg in the driver: adapted models beat the global one on skewed
clients, and adapting reads the clients' training data only."""

import numpy as np
import tensorflow as tf

from tests import tff_test_utils
from tests.training.recipes import recipe_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import driver


def _config(output_dir, **overrides):
  # Two classes per client: one adaptation step on them fits a client.
  return recipe_test_utils.digits_config(output_dir, **{
      'algorithm': 'per_fedavg', 'partition': 'label_skew',
      'classes_per_client': 2, 'rounds': 6, 'attack': 'none',
      'malicious_fraction': 0.0, 'per_fedavg_adapt_steps': 3, 'eval_every': 3,
      **overrides})


class PerFedAvgTest(tff_test_utils.TffTestCase):

  def test_bad_settings_are_refused(self):
    out = self.create_tempdir().full_path
    for overrides, message in (
        (dict(per_fedavg_variant='so'), 'Unknown per_fedavg_variant'),
        (dict(per_fedavg_alpha=-1.0), 'per_fedavg_alpha must be a positive'),
        (dict(per_fedavg_alpha=0.0), 'per_fedavg_alpha must be a positive'),
        (dict(per_fedavg_variant='hf',
              per_fedavg_hessian_product='finite_difference',
              per_fedavg_delta=0.0), 'per_fedavg_delta must be'),
        (dict(per_fedavg_variant='hf', per_fedavg_hessian_product='bfgs'),
         'Unknown per_fedavg_hessian_product'),
        # Settings the run would ignore.
        (dict(per_fedavg_hessian_product='finite_difference'),
         'per_fedavg_hessian_product=finite_difference would be ignored'),
        (dict(per_fedavg_variant='hf', per_fedavg_delta=0.01),
         'per_fedavg_delta=0.01 would be ignored'),
        (dict(per_fedavg_adapt_steps=0), 'per_fedavg_adapt_steps must be'),
    ):
      with self.subTest(overrides), self.assertRaisesRegex(
          config_lib.ConfigError, message):
        _config(out, **overrides)
    # The paper's alpha, whatever the client rate (digits': 0.1); the
    # exact Hessian-vector product.
    settings = _config(out).settings
    self.assertEqual(settings.per_fedavg_alpha, 0.01)
    self.assertEqual(settings.per_fedavg_hessian_product, 'exact')
    self.assertEqual(_config(
        out, per_fedavg_variant='hf',
        per_fedavg_hessian_product='finite_difference',
        per_fedavg_delta=0.01).settings.per_fedavg_delta, 0.01)

  def test_adapted_models_beat_the_global_model(self):
    result = driver.run(_config(self.create_tempdir().full_path))
    accuracy = {kind: np.mean([m.accuracy for m in metrics.values()])
                for kind, metrics in result.evaluations.items()}
    self.assertGreater(accuracy['personalized'], accuracy['global'] + 0.1,
                       accuracy)
    # Released per round: the adapted models and the global one.
    last = result.history[-1]
    self.assertGreater(last['test_accuracy_mean'],
                       last['global_test_accuracy_mean'])

  def test_adaptation_never_reads_validation_or_test_data(self):
    config = _config(self.create_tempdir().full_path, rounds=1,
                     validation_fraction=0.2)
    trainer = driver.Trainer(driver.build_experiment(config))
    weights = trainer.experiment.model_spec.initial_weights(0)
    adapted = trainer.recipe.adapted_models(weights)
    data = trainer.experiment.data
    labels = data.source.y
    held_out = np.concatenate([data.indices(cid, split)
                               for cid in data.client_ids
                               for split in ('validation', 'test')])
    self.assertNotEmpty(held_out)
    before = trainer.context.evaluate(adapted)
    # Poison every held-out label; the adapted weights must not move.
    labels[held_out] = (labels[held_out] + 1) % 10
    poisoned = trainer.recipe.adapted_models(weights)
    for cid in data.client_ids:
      for a, b in zip(adapted[cid].trainable, poisoned[cid].trainable):
        np.testing.assert_array_equal(a, b)
    # Not vacuous: the poisoned labels do change what the models score.
    after = trainer.context.evaluate(adapted)
    self.assertNotEqual([m.accuracy for m in before.values()],
                        [m.accuracy for m in after.values()])


if __name__ == '__main__':
  tf.test.main()
