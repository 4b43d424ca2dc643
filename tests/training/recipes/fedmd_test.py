"""FedMD in the driver: two architectures on label-skewed digits, against
the same architectures trained alone, exact resume; its settings and their
refusals."""

import json
import os

from absl import logging
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests import tff_test_utils
from tests.training.recipes import recipe_test_utils
from tff_fair.training import client_models
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import run_context
from tff_fair.training.recipes import client_architectures
from tff_fair.training.recipes import fedmd

_ARCHITECTURES = ('lenet', 'ditto_cnn')
# 8 clients of 60 digits (42 to train on, 12 to test) of 5 classes each.
_RUN = dict(num_clients=8, clients_per_round=8, rounds=5, local_epochs=10,
            examples_per_client=60, attack='none', malicious_fraction=0.0,
            partition='label_skew', classes_per_client=5, eval_every=1)


def _config(output_dir, **overrides):
  return recipe_test_utils.digits_config(output_dir, **{
      'algorithm': 'fedmd', **_RUN,
      'client_models': 'lenet:0.5,ditto_cnn:0.5', 'public_examples': 300,
      **overrides})


def _texts(output_dir):
  """The recipe's log and metrics.csv without its timings."""
  return recipe_test_utils.run_texts(output_dir, [fedmd.ROUND_LOG])


def _stored_models(output_dir, architectures):
  """Client id -> the bytes of its model in the run's stores, last round."""
  experiment = driver.build_experiment(_config(output_dir))
  models = {}
  for name in set(architectures.values()):
    store = client_models.ClientModelStore(
        os.path.join(output_dir, fedmd.MODELS_DIR, name),
        experiment.model_specs[name].initial_weights(0))
    store.open(_RUN['rounds'])
    for cid in store.trained_client_ids():
      models[cid] = [w.tobytes() for w in tf.nest.flatten(store.weights(cid))]
  return models


def _mean_accuracy(metrics, client_ids) -> float:
  return float(np.mean([metrics[c].accuracy for c in client_ids]))


class FedMDSettingsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('no_public_set', dict(public_examples=0), 'set --public_examples=N'),
      ('alignment_past_the_public_set',
       dict(fedmd_alignment_examples=301),
       '--fedmd_alignment_examples=301 is more than the'),
      ('model_not_among_them', dict(model='ditto_cnn',
                                    client_models='lenet'),
       '--model=ditto_cnn is not one of --client_models=lenet'),
      ('architecture_without_clients',
       dict(client_models='lenet:0.95,ditto_cnn:0.05'),
       'gives no client of --num_clients=8 to ditto_cnn'),
      ('zero_digest_epochs', dict(fedmd_digest_epochs=0),
       '--fedmd_digest_epochs must be an int >= 1'),
      ('negative_pretraining', dict(fedmd_pretrain_epochs=-1),
       '--fedmd_pretrain_epochs must be an int >= 0'),
      ('zero_learning_rate', dict(fedmd_digest_learning_rate=0.0),
       'fedmd_digest_learning_rate must be a positive number'),
      ('robust_aggregator', dict(aggregator='robust'),
       '--aggregator=robust would be ignored'),
      ('server_optimizer', dict(server_optimizer='adam'),
       '--server_optimizer=adam would be ignored'),
      ('update_attack', dict(attack='random_updates',
                             malicious_fraction=0.25),
       '--attack=random_updates would be ignored'),
      ('a_feddf_setting', dict(feddf_patience=3),
       '--feddf_patience=3 is a setting of --algorithm=feddf'),
  )
  def test_refused_naming_the_flag(self, overrides, message):
    with self.assertRaisesRegex(config_lib.ConfigError, message):
      _config(self.create_tempdir().full_path, **overrides)

  def _file(self, mapping) -> str:
    return self.create_tempfile(content=json.dumps(mapping)).full_path

  def test_a_file_gives_each_client_its_architecture(self):
    ids = driver.build_experiment(_config('unused')).data.client_ids
    mapping = {cid: _ARCHITECTURES[i % 3 == 0] for i, cid in enumerate(ids)}
    config = _config(self.create_tempdir().full_path, client_models='',
                     client_models_file=self._file(mapping))
    self.assertEqual(fedmd.FedMD.model_variants(config),
                     {'lenet': 'lenet', 'ditto_cnn': 'ditto_cnn'})
    driver.build_experiment(config)  # Checks the file against the clients.
    self.assertEqual(client_architectures.client_assignment(config, ids),
                     mapping)
    for bad, message in (
        ({**mapping, 'nobody': 'lenet'}, 'names 1 client'),
        ({cid: 'lenet' for cid in ids[1:]}, 'gives no architecture to 1'),
    ):
      with self.subTest(message), self.assertRaisesRegex(
          config_lib.ConfigError, f'--client_models_file=.*{message}'):
        driver.build_experiment(_config(
            self.create_tempdir().full_path, client_models='',
            client_models_file=self._file(bad)))

  @parameterized.named_parameters(
      ('both', dict(client_models='lenet'),
       '--client_models and --client_models_file both'),
      ('unknown_architecture', dict(client_models_file={'c': 'cnn'}),
       "client 'c' has unknown architecture 'cnn'"),
      ('model_not_among_them', dict(client_models_file={'c': 'ditto_cnn'}),
       '--model=lenet is not one of --client_models_file='),
      ('not_an_object', dict(client_models_file=['lenet']),
       'must hold a non-empty JSON object'),
  )
  def test_a_bad_file_is_refused(self, overrides, message):
    overrides.setdefault('client_models', '')
    given = overrides.get('client_models_file', {'c': 'lenet'})
    overrides['client_models_file'] = self._file(given)
    with self.assertRaisesRegex(config_lib.ConfigError, message):
      _config(self.create_tempdir().full_path, **overrides)

  def test_label_poisoning_is_read(self):
    config = _config(self.create_tempdir().full_path,
                     attack='label_poisoning', malicious_fraction=0.25)
    self.assertEqual(config.attack, 'label_poisoning')


class FedMDRunTest(tff_test_utils.TffTestCase):

  def _run(self, output_dir, kill_in_round=None):
    """A FedMD run; the state its final evaluations saw."""
    return recipe_test_utils.run_keeping_state(
        fedmd.FedMD, _config(output_dir), kill_in_round)

  def _standalone(self, model):
    """Each client's own model of `model`, trained alone from the seeded
    initial weights (the same clients' data and budget of local epochs)."""
    return recipe_test_utils.standalone_evaluations(
        self, model, _config('unused'), **_RUN)

  def _pretrained_alone(self, model, start):
    """Each client's model of `model` trained alone as standalone does, but
    from FedMD's start (the initial model pretrained on the public set)."""
    context = run_context.RunContext(driver.build_experiment(
        _config(self.create_tempdir().full_path, model=model)))
    trained = context.train_locally(start, context.standalone_epochs(), tag=0)
    return context.evaluate(trained, variant=experiment_lib.PLAIN)

  def test_two_architectures_beat_training_alone_and_resume_exactly(self):
    straight_dir = self.create_tempdir().full_path
    straight, state = self._run(straight_dir)
    evaluations = straight.evaluations
    self.assertCountEqual(evaluations, ['personalized'])
    ids = sorted(evaluations['personalized'])
    self.assertLen(ids, 8)
    config = _config('unused')
    architectures = client_architectures.assign_architectures(
        ids, client_architectures.architecture_shares(config), config.seed)
    self.assertCountEqual(set(architectures.values()), _ARCHITECTURES)
    history = straight.history
    self.assertLen(history, 5)
    for h in history:
      self.assertEqual(h['consensus_size'], 8)
      self.assertEqual(h['consensus_examples'], 300)
      for name in _ARCHITECTURES:
        self.assertEqual(h[f'{name}_clients'], 4)
        self.assertGreater(h[f'{name}_digest_loss'], 0)
    rows = recipe_test_utils.read_round_log(straight_dir, fedmd.ROUND_LOG)
    self.assertLen(rows, 5 * 8)
    self.assertEqual({r['client']: r['architecture'] for r in rows},
                     architectures)

    # Each client's own FedMD model, against its own model of the same
    # architecture trained alone on the same data with the same budget of
    # local epochs: from the seeded initial model (standalone), and from
    # FedMD's start, the initial model pretrained on the labeled public
    # set (what FedMD adds to that is the digests of the consensus).
    digested = evaluations['personalized']
    standalone = {name: self._standalone(name) for name in _ARCHITECTURES}
    starts = state['models']
    pretrained = {name: self._pretrained_alone(name, starts[name])
                  for name in _ARCHITECTURES}
    results = {}
    for name in _ARCHITECTURES:
      group = [cid for cid in ids if architectures[cid] == name]
      results[name] = (_mean_accuracy(digested, group),
                       _mean_accuracy(standalone[name], group),
                       _mean_accuracy(pretrained[name], group))
      self.assertGreater(results[name][0], results[name][1], results)
      self.assertGreaterEqual(results[name][0], results[name][2], results)
    fedmd_acc, alone, pretrained_alone = np.mean(list(results.values()),
                                                 axis=0)
    logging.info('Mean test accuracy (FedMD, alone, pretrained then alone):'
                 ' %s; per architecture %s.',
                 (fedmd_acc, alone, pretrained_alone), results)
    # Measured: 0.969 against 0.917 alone and 0.958 pretrained then alone
    # (test splits of 12 digits a client). Against the pretrained models
    # trained alone the margin is one test digit of 96 (LeNet equal,
    # ditto_cnn 0.958 against 0.938): most of FedMD's gain here is the
    # pretraining's, the digests add little on data this small.
    self.assertGreater(fedmd_acc, alone + 0.03, results)
    self.assertGreater(fedmd_acc, pretrained_alone, results)
    # Why pretraining is on by default: without it the consensus of the
    # first rounds is that of barely trained models, and digesting it holds
    # every model back. The same run with --fedmd_pretrain_epochs=0
    # measured 0.906 against 0.917 alone: FedMD did not beat training
    # alone (docs/algorithms/fedmd.md).

    # Killed in round 3 after its log rows and models were written, before
    # its checkpoint: the resumed run restores round 2's models and ends as
    # the straight one did, byte for byte.
    split_dir = self.create_tempdir().full_path
    with self.assertRaises(recipe_test_utils.Killed):
      self._run(split_dir, kill_in_round=3)
    resumed, resumed_state = self._run(split_dir)
    self.assertEqual(resumed.resumed_from_round, 2)
    self.assertEqual(_texts(split_dir), _texts(straight_dir))
    self.assertEqual(resumed.evaluations, straight.evaluations)
    recipe_test_utils.assert_same_state(self, state, resumed_state)
    straight_models = _stored_models(straight_dir, architectures)
    self.assertCountEqual(straight_models, ids)
    self.assertEqual(_stored_models(split_dir, architectures),
                     straight_models)


if __name__ == '__main__':
  tf.test.main()
