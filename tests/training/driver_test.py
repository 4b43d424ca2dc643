"""The round driver on real digits: resume equivalence, baselines, releases."""

import csv
import json
import os
from unittest import mock

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training.recipes import registry
from tff_fair.training import sampling


def _config(output_dir, **overrides):
  values = dict(
      dataset='digits', model='mlp', partition='dirichlet', alpha=0.5,
      num_clients=4, clients_per_round=3, rounds=4, batch_size=16,
      client_learning_rate=0.1,
      seed=7, output_dir=output_dir, eval_every=2)
  values.update(overrides)
  return registry.make_config(**values)


def _accuracies(result, kind='global'):
  return np.array([m.accuracy for m in result.evaluations[kind].values()])


def _losses(result, kind='global'):
  return np.array([m.loss for m in result.evaluations[kind].values()])


class SamplingTest(tff_test_utils.TffTestCase):

  def test_sampling_is_a_function_of_seed_and_round(self):
    ids = [f'c{i}' for i in range(50)]
    a = sampling.sample_clients(ids, 10, seed=1, round_num=3)
    self.assertEqual(a, sampling.sample_clients(ids, 10, seed=1, round_num=3))
    self.assertLen(set(a), 10)
    self.assertNotEqual(a, sampling.sample_clients(ids, 10, seed=1,
                                                 round_num=4))
    self.assertNotEqual(a, sampling.sample_clients(ids, 10, seed=2,
                                                 round_num=3))


class ResumeTest(tff_test_utils.TffTestCase):

  def test_interrupted_run_resumes_to_the_same_result(self):
    straight_dir = self.create_tempdir().full_path
    straight = driver.run(_config(straight_dir))
    self.assertEqual(straight.resumed_from_round, 0)
    self.assertLen(straight.history, 4)
    # Evaluated rounds (eval_every=2) release every client's test accuracy
    # as a TensorBoard histogram; round 4's is the final evaluation's.
    histograms = tff_test_utils.tensorboard_values(
        os.path.join(straight_dir, 'tensorboard'),
        'test_accuracy_per_client')
    self.assertEqual(sorted(histograms), [2, 4])
    buckets = histograms[4]
    self.assertEqual(buckets[:, 2].sum(), 4)  # One count per client.
    self.assertAlmostEqual(buckets[0, 0], _accuracies(straight).min(),
                           places=5)
    self.assertAlmostEqual(buckets[-1, 1], _accuracies(straight).max(),
                           places=5)
    with open(os.path.join(straight_dir, 'metrics.csv')) as f:
      self.assertNotIn('per_client', f.readline())  # Arrays: TensorBoard only.

    split_dir = self.create_tempdir().full_path
    first = driver.run(_config(split_dir, rounds=2))
    self.assertLen(first.history, 2)
    # A crash in round 3 just after its checkpoint is written: the resume
    # starts after round 3, so round 3's row must already be released.
    real_save = tff.program.FileProgramStateManager.save

    async def save_then_crash(manager, state, version):
      await real_save(manager, state, version)
      if version == 3:
        raise RuntimeError('killed after the checkpoint of round 3')

    with mock.patch.object(tff.program.FileProgramStateManager, 'save',
                           save_then_crash):
      with self.assertRaisesRegex(RuntimeError, 'killed after'):
        driver.run(_config(split_dir, rounds=4))
    resumed = driver.run(_config(split_dir, rounds=4))
    self.assertEqual(resumed.resumed_from_round, 3)
    # config.json describes the extended run, not the first invocation.
    self.assertEqual(config_lib.load_saved(split_dir)['rounds'], 4)
    self.assertLen(resumed.history, 1)  # Only round 4 ran again.

    self.assertAllClose(_losses(resumed), _losses(straight), rtol=1e-4)
    self.assertAllClose(_accuracies(resumed), _accuracies(straight))
    self.assertAllClose(straight.history[3]['train_loss'],
                        resumed.history[0]['train_loss'], rtol=1e-4)

    # The per-round release holds each round once, in order.
    with open(os.path.join(split_dir, 'metrics.csv')) as f:
      rounds = [int(row['round']) for row in csv.DictReader(f)]
    self.assertEqual(rounds, [1, 2, 3, 4])

    # Asking for fewer rounds than the checkpoint holds is refused.
    with self.assertRaisesRegex(config_lib.ConfigError,
                                'checkpoint of round 4, past rounds=3'):
      driver.run(_config(split_dir, rounds=3))

  def test_training_improves_the_global_model(self):
    out = self.create_tempdir().full_path
    short = driver.run(_config(out, rounds=1, clients_per_round=4,
                               eval_every=1))
    longer = driver.run(_config(out, rounds=6, clients_per_round=4,
                                eval_every=1))
    self.assertGreater(np.mean(_accuracies(longer)),
                       np.mean(_accuracies(short)) + 0.2)
    self.assertLess(np.mean(_losses(longer)), np.mean(_losses(short)))
    # Where each round's seconds went: released phases add up to at most
    # the round's seconds (the rest is the release's own bookkeeping), and
    # the checkpoint (written after the row) is in the history only.
    phases = ('seconds_data', 'seconds_train', 'seconds_client_state',
              'seconds_evaluation')
    with open(os.path.join(out, 'metrics.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertLen(rows, 6)
    for row, released in zip(rows[1:], longer.history):
      self.assertNotIn('seconds_checkpoint', row)
      spent = [float(row[name]) for name in phases]
      self.assertTrue(all(s >= 0 for s in spent), row)
      self.assertGreater(float(row['seconds_train']), 0.0)
      self.assertLessEqual(sum(spent), float(row['seconds']))
      self.assertGreater(sum(spent), 0.9 * float(row['seconds']))
      self.assertGreater(released['seconds_checkpoint'], 0.0)


class DivergenceTest(tff_test_utils.TffTestCase):

  def test_a_diverging_run_warns_once_and_a_sound_one_never(self):
    sound = self.create_tempdir().full_path
    with self.assertLogs(level='INFO') as logs:
      driver.run(_config(sound, rounds=2, eval_every=0))
    self.assertEmpty([r for r in logs.output if 'diverged' in r])
    # Weights of 1e30 after one step: the next batch's logits overflow.
    diverging = self.create_tempdir().full_path
    with self.assertLogs(level='WARNING') as logs:
      driver.run(_config(diverging, rounds=2, eval_every=0,
                         client_learning_rate=1e30))
    warnings = [r for r in logs.output if 'has diverged' in r]
    self.assertLen(warnings, 1)
    self.assertIn('Round 1:', warnings[0])


class BaselinesTest(tff_test_utils.TffTestCase):

  def test_fine_tuning_personalizes_label_skewed_clients(self):
    out = self.create_tempdir().full_path
    result = driver.run(_config(
        out, algorithm='fedavg_ft', partition='label_skew',
        classes_per_client=2, rounds=3, clients_per_round=4,
        finetune_epochs=3, eval_every=0))
    self.assertEqual(set(result.evaluations),
                     {'global', 'fine_tuned', 'validated'})
    # Two classes per client: a few local epochs beat the global model.
    self.assertGreater(np.mean(_accuracies(result, 'fine_tuned')),
                       np.mean(_accuracies(result, 'global')) + 0.1)
    with open(os.path.join(out, 'clients_final.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertLen(rows, 12)
    self.assertEqual({r['model'] for r in rows},
                     {'global', 'fine_tuned', 'validated'})
    # Every client keeps some fine-tuning, chosen on its validation split.
    with open(os.path.join(out, 'personalization.csv')) as f:
      choices = list(csv.DictReader(f))
    self.assertLen(choices, 4)
    self.assertNotIn('global', {row['uses'] for row in choices})
    self.assertGreater(np.mean(_accuracies(result, 'validated')),
                       np.mean(_accuracies(result, 'global')) + 0.1)

  def test_a_client_falls_back_where_fine_tuning_hurts(self):
    # Two clients' training labels are noise (their validation and test
    # labels are not): fine-tuning on them hurts, so on their validation
    # splits they keep the global model, and say so per client.
    out = self.create_tempdir().full_path
    noise = os.path.join(self.create_tempdir().full_path, 'noise.json')
    noisy = ['client_0000', 'client_0001']
    with open(noise, 'w') as f:
      json.dump(dict.fromkeys(noisy, 1.0), f)
    result = driver.run(_config(
        out, algorithm='fedavg_ft', partition='homogeneous', rounds=6,
        clients_per_round=4, finetune_epochs=3, eval_every=0,
        label_noise_file=noise))
    with open(os.path.join(out, 'personalization.csv')) as f:
      uses = {row['client']: row['uses'] for row in csv.DictReader(f)}
    self.assertEqual([uses[cid] for cid in noisy], ['global', 'global'])
    for cid in noisy:
      self.assertEqual(result.evaluations['validated'][cid],
                       result.evaluations['global'][cid])
      # Not vacuous: fine-tuning did hurt them.
      self.assertLess(result.evaluations['fine_tuned'][cid].accuracy,
                      result.evaluations['global'][cid].accuracy)

  def test_common_test_evaluation_measures_each_model_on_the_pooled_splits(
      self):
    # Without server held-out sets the common test set is every client's
    # test split pooled. A run finished without the setting is re-evaluated
    # with it (it may change on resumption): the same models, new kinds.
    out = self.create_tempdir().full_path
    settings = dict(algorithm='fedavg_ft', partition='label_skew',
                    classes_per_client=2, rounds=3, clients_per_round=4,
                    finetune_epochs=3, eval_every=0)
    before = driver.run(_config(out, **settings))
    self.assertEqual(set(before.evaluations),
                     {'global', 'fine_tuned', 'validated'})
    after = driver.run(_config(out, common_test_evaluation=True, **settings))
    self.assertEqual(after.resumed_from_round, 3)
    self.assertEqual(set(after.evaluations), {
        'global', 'fine_tuned', 'validated', 'global:common_test',
        'fine_tuned:common_test', 'validated:common_test'})
    for kind in ('global', 'fine_tuned', 'validated'):
      self.assertEqual(after.evaluations[kind], before.evaluations[kind])
    own = after.evaluations['global']
    pooled_size = sum(m.num_examples for m in own.values())
    common = after.evaluations['global:common_test']
    self.assertEqual(list(common), list(own))
    self.assertLen(set(common.values()), 1)  # One model, one data set.
    (metrics,) = set(common.values())
    self.assertEqual(metrics.num_examples, pooled_size)
    # The pool is the concatenation of the clients' test splits.
    self.assertAlmostEqual(
        metrics.accuracy,
        sum(m.accuracy * m.num_examples for m in own.values()) / pooled_size,
        places=6)
    # A two-class fine-tuned model is judged on all classes: far worse on
    # the pool than on its own split; and the clients' scores differ.
    self.assertLess(np.mean(_accuracies(after, 'fine_tuned:common_test')),
                    np.mean(_accuracies(after, 'fine_tuned')) - 0.3)
    self.assertGreater(len(set(_accuracies(after, 'fine_tuned:common_test'))),
                       1)
    with open(os.path.join(out, 'clients_final.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertLen(rows, 24)

  def test_standalone_trains_each_client_alone(self):
    out = self.create_tempdir().full_path
    config = _config(out, algorithm='standalone', partition='label_skew',
                     classes_per_client=2, rounds=8, clients_per_round=2,
                     local_epochs=1, eval_every=1)  # (It runs no rounds.)
    trainer = driver.Trainer(driver.build_experiment(config))
    # 8 rounds x 1 epoch x half the clients per round.
    self.assertEqual(trainer.context.standalone_epochs(), 4)
    result = trainer.run()
    self.assertEqual(set(result.evaluations), {'standalone'})
    # Each client separates its own two classes far better than chance.
    self.assertGreater(np.mean(_accuracies(result, 'standalone')), 0.8)


if __name__ == '__main__':
  tf.test.main()
