"""Several model variants in one run: built, checked, evaluated by group."""

import tensorflow as tf

from tests import tff_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import run_context
from tff_fair.training.recipes import registry


def _config(output_dir):
  return registry.make_config(
      dataset='digits', partition='homogeneous', num_clients=4,
      clients_per_round=4, rounds=1, output_dir=output_dir)


class ModelVariantsTest(tff_test_utils.TffTestCase):

  def test_each_client_is_measured_with_its_variant(self):
    experiment = experiment_lib.build_experiment(
        _config(self.create_tempdir().full_path),
        variants={'cnn': 'ditto_cnn'})
    self.assertCountEqual(experiment.model_specs,
                          [experiment_lib.TRAINED, experiment_lib.PLAIN,
                           'cnn'])
    context = run_context.RunContext(experiment)
    lenet = experiment.model_spec.initial_weights(0)
    cnn = experiment.model_specs['cnn'].initial_weights(0)
    ids = list(experiment.data.client_ids)
    variant = {cid: ('cnn' if i % 2 else experiment_lib.TRAINED)
               for i, cid in enumerate(ids)}
    weights = {cid: cnn if variant[cid] == 'cnn' else lenet for cid in ids}
    mixed = context.evaluate(weights, variant=variant)
    # The same as measuring each group alone with its own architecture.
    alone = {**context.evaluate(lenet, client_ids=ids[0::2]),
             **context.evaluate(cnn, client_ids=ids[1::2], variant='cnn')}
    self.assertEqual(mixed, {cid: alone[cid] for cid in ids})
    self.assertNotEqual(mixed[ids[0]].loss, mixed[ids[1]].loss)
    with self.assertRaisesRegex(KeyError, "Unknown model variant 'rnn'"):
      context.evaluate(lenet, variant='rnn')

  def test_a_variant_that_cannot_read_the_data_is_refused(self):
    with self.assertRaisesRegex(config_lib.ConfigError,
                                '--model=text_cnn reads token ids'):
      experiment_lib.build_experiment(
          _config(self.create_tempdir().full_path),
          variants={'text': 'text_cnn'})


if __name__ == '__main__':
  tf.test.main()
