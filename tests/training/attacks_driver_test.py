"""Byzantine attacks through the round driver, on real digits.

A2/A3 must change what the malicious clients send, and nothing else; A1
must change the labels the malicious clients train on, and nothing else.
"""

import json

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests import tff_test_utils
from tff_fair.algorithms import fed_avg
from tff_fair import attacks
from tff_fair.algorithms import update_attacks
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training.recipes import registry
from tff_fair.training import sampling


def _config(output_dir, **overrides):
  values = dict(
      dataset='digits', partition='homogeneous', num_clients=4,
      clients_per_round=4, rounds=1, batch_size=16,
      client_learning_rate=0.1, seed=3, eval_every=0,
      malicious_fraction=0.5, output_dir=output_dir)
  values.update(overrides)
  return registry.make_config(**values)


def _flat(weights) -> np.ndarray:
  return np.concatenate([np.ravel(t) for t in weights.trainable])


class UpdateAttackTest(tff_test_utils.TffTestCase):

  @parameterized.parameters(attacks.MODEL_REPLACEMENT,
                            attacks.RANDOM_UPDATES)
  def test_attack_reaches_only_the_malicious_clients(self, kind):
    config = _config(self.create_tempdir().full_path, attack=kind)
    trainer = driver.Trainer(driver.build_experiment(config))
    data = trainer.experiment.data
    ids = data.client_ids
    self.assertLen(trainer.malicious, 2)
    self.assertEqual(trainer.context.poisoned, frozenset())  # An update attack.
    state, _ = trainer._restore()
    start = _flat(trainer.process.get_model_weights(state))

    # Round 1 as the driver runs it: every client, attacks included.
    after, _ = trainer._run_rounds(state, 0)
    averaged = start - _flat(trainer.process.get_model_weights(after))

    # Each client of round 1 alone, with the input the driver gives it and
    # with no attack: what it sends, and what it would send if benign.
    datasets = sampling.client_datasets(trainer.experiment, ids, 1,
                                      config.local_epochs)

    def sent(dataset, spec):
      output = trainer.process.next(state,
                                    [fed_avg.client_input(dataset, spec)])
      return start - _flat(trainer.process.get_model_weights(output.state))

    updates = {}
    for i, (cid, dataset) in enumerate(zip(ids, datasets)):
      honest = sent(dataset, update_attacks.no_attack(client_index=i))
      actual = sent(dataset, trainer._client_spec(cid, 1))
      updates[cid] = actual
      if cid not in trainer.malicious:
        np.testing.assert_allclose(actual, honest, rtol=1e-5, atol=1e-7)
      elif kind == attacks.MODEL_REPLACEMENT:
        np.testing.assert_allclose(actual, config.attack_scale * honest,
                                   rtol=1e-4, atol=1e-6)
      else:  # Noise with the update's spread, unrelated to the update.
        self.assertLess(abs(np.corrcoef(actual, honest)[0, 1]), 0.1)
        self.assertAllClose(np.std(actual) / np.std(honest), 1.0, atol=0.5)
    # The driver's round averaged exactly these (weights: train examples).
    sizes = np.array([data.num_examples(cid, 'train') for cid in ids])
    expected = sum(s * updates[cid] for s, cid in zip(sizes, ids)) / sum(sizes)
    np.testing.assert_allclose(averaged, expected, rtol=1e-4, atol=1e-6)


class LabelPoisoningTest(tff_test_utils.TffTestCase):

  def test_malicious_clients_train_on_random_labels(self):
    config = _config(self.create_tempdir().full_path,
                     attack=attacks.LABEL_POISONING,
                     algorithm='standalone', rounds=12,
                     eval_every=1)  # (It runs no rounds.)
    trainer = driver.Trainer(driver.build_experiment(config))
    ids = trainer.experiment.data.client_ids
    self.assertLen(trainer.malicious, 2)
    self.assertEqual(trainer.context.poisoned, trainer.malicious)
    for cid in ids:  # A data attack: updates are sent as trained.
      self.assertEqual(int(trainer._client_spec(cid, 1)['kind']), 0)

    # The batches the driver trains on (rounds and standalone training),
    # against the same batches unpoisoned: same order, other labels.
    def labels(label_noise):
      return [np.concatenate([b['y'] for b in ds.as_numpy_iterator()])
              for ds in sampling.client_datasets(trainer.experiment, ids, 1, 1,
                                                 label_noise=label_noise)]

    self.assertEqual(trainer.context.label_noise,
                     dict.fromkeys(trainer.malicious, 1.0))
    for cid, fed, true in zip(ids, labels(trainer.context.label_noise),
                              labels({})):
      if cid in trainer.malicious:
        self.assertBetween(np.mean(fed == true), 0.0, 0.25)  # Chance: 0.1.
        self.assertTrue(np.all((fed >= 0) & (fed < 10)))
      else:
        np.testing.assert_array_equal(fed, true)

    # Trained on them, a malicious client's model is near chance on its
    # own (true) test labels; a benign one is not.
    result = trainer.run()
    accuracy = {cid: m.accuracy
                for cid, m in result.evaluations['standalone'].items()}
    for cid in ids:
      if cid in trainer.malicious:
        self.assertLess(accuracy[cid], 0.3)
      else:
        self.assertGreater(accuracy[cid], 0.7)


class LabelNoiseFileTest(tff_test_utils.TffTestCase):

  def _write(self, mapping) -> str:
    path = self.create_tempfile('noise.json').full_path
    with open(path, 'w') as f:
      json.dump(mapping, f)
    return path

  def test_named_clients_train_on_that_share_of_random_labels(self):
    path = self._write({'client_0000': 1.0, 'client_0001': 0.5})
    config = _config(self.create_tempdir().full_path, label_noise_file=path,
                     malicious_fraction=0.0)
    trainer = driver.Trainer(driver.build_experiment(config))
    data = trainer.experiment.data
    changed = {}
    for cid in data.client_ids:
      _, true = data.arrays(cid, 'train')
      _, trained_on = trainer.context.training_arrays(cid)
      changed[cid] = np.mean(trained_on != true)
    # A random class is the true one 1 time in 10.
    self.assertBetween(changed['client_0000'], 0.8, 0.97)
    self.assertBetween(changed['client_0001'], 0.35, 0.5)
    self.assertEqual(changed['client_0002'], 0.0)
    self.assertEqual(changed['client_0003'], 0.0)

  def test_bad_files_are_refused_before_any_work(self):
    out = self.create_tempdir().full_path
    for mapping, message in (
        ({'client_0000': 1.5}, r'fraction in \[0, 1\]'),
        ({'client_0042': 0.5}, 'this run does not have'),
        ({'client_0000': 'half'}, 'not a finite number'),
    ):
      with self.subTest(mapping), self.assertRaisesRegex(
          config_lib.ConfigError, message):
        driver.build_experiment(_config(
            out, label_noise_file=self._write(mapping),
            malicious_fraction=0.0))


if __name__ == '__main__':
  tf.test.main()
