"""Ditto through the round driver: persistence, resume, lambdas, attacks."""

import json
import os
from unittest import mock

import numpy as np
import tensorflow as tf

from tests import tff_test_utils
from tff_fair.state import client_store
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training import experiment as experiment_lib


def _config(output_dir, **overrides):
  values = dict(
      algorithm='ditto', dataset='digits', partition='label_skew',
      classes_per_client=2, num_clients=4, clients_per_round=2, rounds=3,
      batch_size=16, client_learning_rate=0.1, personal_learning_rate=0.1,
      seed=11, output_dir=output_dir, eval_every=0)
  values.update(overrides)
  return config_lib.RunConfig(**values)


def _trainer(config):
  config_lib.save_if_new(config)
  return driver.Trainer(experiment_lib.build_experiment(config))


def _accuracies(result, kind):
  return np.array([m.accuracy for m in result.evaluations[kind].values()])


class DittoDriverTest(tff_test_utils.TffTestCase):

  def test_resume_gives_the_same_personal_models(self):
    settings = dict(personal_optimizer='adam', personal_learning_rate=0.01,
                    personal_epochs=2)
    straight = driver.run(_config(self.create_tempdir().full_path, rounds=4,
                                  **settings))
    out = self.create_tempdir().full_path
    driver.run(_config(out, rounds=2, **settings))
    resumed = driver.run(_config(out, rounds=4, **settings))
    self.assertEqual(resumed.resumed_from_round, 2)
    for kind in ('global', 'personalized'):
      self.assertAllClose(_accuracies(resumed, kind),
                          _accuracies(straight, kind))
    # Two classes per client: personal models beat the global one.
    self.assertGreater(np.mean(_accuracies(straight, 'personalized')),
                       np.mean(_accuracies(straight, 'global')) + 0.2)
    # The store keeps one manifest (the checkpoint's) and one file a client.
    store = os.path.join(out, 'personal')
    self.assertEqual(os.listdir(os.path.join(store, 'manifests')),
                     ['v4.json'])
    for client_dir in os.listdir(os.path.join(store, 'clients')):
      self.assertLen(os.listdir(os.path.join(store, 'clients', client_dir)),
                     1)

  def test_unsampled_keep_and_new_clients_start_from_global(self):
    out = self.create_tempdir().full_path
    trainer = _trainer(_config(out, rounds=2))
    state, _ = trainer._restore()
    personalize = trainer.process.personalize
    seen_inputs = []

    def spy(state_arg, inputs):
      seen_inputs.append(inputs)
      return personalize(state_arg, inputs)

    with mock.patch.object(type(trainer.process), 'personalize',
                           new=property(lambda _: spy)):
      state, _ = trainer._run_rounds(state, 0)
    ids = trainer.experiment.data.client_ids
    round1 = driver.sample_clients(ids, 2, seed=11, round_num=1)
    round2 = driver.sample_clients(ids, 2, seed=11, round_num=2)
    initial = trainer.experiment.model_spec.initial_weights(11)
    # Round 1: every client is new and starts from w^0.
    for client_input in seen_inputs[0]:
      self.assertAllClose(client_input['personal'].trainable,
                          initial.trainable)
    personal = trainer._personal
    for cid in set(ids) - set(round1) - set(round2):
      self.assertIsNone(personal.weights(cid))  # Never trained: no state.
    # A client sampled in round 1 but not round 2 kept its round-1 model.
    manifest = os.path.join(out, 'personal', 'manifests', 'v2.json')
    with open(manifest) as f:
      versions = {c: e['version'] for c, e in json.load(f)['clients'].items()}
    for cid in round1:
      self.assertEqual(versions[cid], 2 if cid in round2 else 1)

  def test_rounds_touch_only_the_sampled_clients(self):
    # Scale: with many clients, a round costs work for its sample only.
    config = _config(self.create_tempdir().full_path, partition='homogeneous',
                     num_clients=60, clients_per_round=3, rounds=2)
    trainer = _trainer(config)
    state, _ = trainer._restore()
    data = trainer.experiment.data
    read = []
    arrays = type(data).arrays

    def spy(self_, client_id, split):
      read.append(client_id)
      return arrays(self_, client_id, split)

    with mock.patch.object(type(data), 'arrays', spy):
      trainer._run_rounds(state, 0)
    sampled = set()
    for round_num in (1, 2):
      sampled.update(driver.sample_clients(data.client_ids, 3, seed=11,
                                           round_num=round_num))
    self.assertNotEmpty(read)
    self.assertContainsSubset(set(read), sampled)
    self.assertLen(os.listdir(os.path.join(config.output_dir, 'personal',
                                           'clients')), len(sampled))

  def test_lambda_grid_choice_is_kept_with_the_model(self):
    out = self.create_tempdir().full_path
    trainer = _trainer(_config(out, rounds=1, clients_per_round=4,
                               ditto_lambda_grid='0.01,100'))
    trainer.run()
    lambdas = {cid: trainer._personal.lam(cid)
               for cid in trainer.experiment.data.client_ids}
    self.assertTrue(set(lambdas.values()) <= {0.01, 100.0}, lambdas)

  def test_lambdas_file_must_cover_every_client(self):
    out = self.create_tempdir().full_path
    path = os.path.join(out, 'lambdas.json')
    with open(path, 'w') as f:
      json.dump({'client_0000': 0.5, 'client_0001': 1.0}, f)
    with self.assertRaisesRegex(config_lib.ConfigError,
                                'no lambda for 2 client'):
      driver.run(_config(os.path.join(out, 'run'), ditto_lambdas_file=path))
    with open(path, 'w') as f:
      json.dump({f'client_000{i}': -1.0 for i in range(4)}, f)
    with self.assertRaisesRegex(config_lib.ConfigError, '>= 0'):
      driver.run(_config(os.path.join(out, 'run'), ditto_lambdas_file=path))

  def test_damaged_personal_model_stops_the_resume(self):
    out = self.create_tempdir().full_path
    driver.run(_config(out, rounds=1))
    clients = os.path.join(out, 'personal', 'clients')
    victim = os.path.join(clients, sorted(os.listdir(clients))[0])
    path = os.path.join(victim, os.listdir(victim)[0])
    with open(path, 'r+b') as f:
      f.seek(100)
      f.write(b'\0' * 16)
    with self.assertRaisesRegex(client_store.ClientStateError, 'damaged'):
      # Every personal model is read by the final evaluation at the latest.
      driver.run(_config(out, rounds=2))

  def test_attack_metrics_separate_benign_clients(self):
    out = self.create_tempdir().full_path
    result = driver.run(_config(out, rounds=1, attack='label_poisoning',
                                malicious_fraction=0.5))
    with open(os.path.join(out, 'summary.json')) as f:
      summary = json.load(f)
    for kind in ('global', 'personalized'):
      self.assertEqual(summary[f'{kind}:benign']['accuracy']['count'], 2)
      self.assertEqual(summary[f'{kind}:malicious']['accuracy']['count'], 2)
    self.assertLen(result.evaluations['personalized'], 4)


if __name__ == '__main__':
  tf.test.main()
