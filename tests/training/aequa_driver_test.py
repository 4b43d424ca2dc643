"""Aequa through the driver: curve, allocation by contribution, tables."""

import csv
import json
import os

import numpy as np
import tensorflow as tf

from tests import tff_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training import experiment as experiment_lib
from tff_fair.training.recipes import registry


def _config(output_dir, **overrides):
  values = dict(
      algorithm='aequa', dataset='digits', partition='homogeneous',
      num_clients=4, clients_per_round=4, rounds=8, batch_size=16,
      client_learning_rate=0.1, p_min=0.25, width_step=0.25, seed=5,
      eval_every=0, output_dir=output_dir)
  values.update(overrides)
  return registry.make_config(**values)


class AequaDriverTest(tff_test_utils.TffTestCase):

  def test_widths_follow_supplied_contributions(self):
    out = self.create_tempdir().full_path
    contributions = {'client_0000': 0.35, 'client_0001': 0.1,
                     'client_0002': 0.5, 'client_0003': 0.2}
    path = os.path.join(out, 'contributions.json')
    with open(path, 'w') as f:
      json.dump(contributions, f)
    run_dir = os.path.join(out, 'run')
    # With per-round evaluation: the slimmable global model at full width.
    result = driver.run(_config(run_dir, contributions_file=path,
                                eval_every=1))
    self.assertEqual(set(result.evaluations), {'global', 'aequa'})
    with open(os.path.join(run_dir, 'metrics.csv')) as f:
      per_round = list(csv.DictReader(f))
    self.assertLen(per_round, 8)
    self.assertAlmostEqual(
        float(per_round[-1]['test_accuracy_mean']),
        np.mean([m.accuracy for m in result.evaluations['global'].values()]),
        places=5)
    with open(os.path.join(run_dir, 'aequa_allocation.csv')) as f:
      rows = {r['client']: r for r in csv.DictReader(f)}
    with open(os.path.join(run_dir, 'width_accuracy.csv')) as f:
      curve = {float(r['width']): float(r['test_accuracy'])
               for r in csv.DictReader(f)}
    self.assertEqual(sorted(curve), [0.25, 0.5, 0.75, 1.0])
    by_contribution = sorted(contributions, key=contributions.get)
    widths = [float(rows[c]['width']) for c in by_contribution]
    self.assertEqual(widths, sorted(widths))  # Monotone in contribution.
    # The same curve and allocation in TensorBoard.
    logdir = os.path.join(run_dir, 'tensorboard', 'aequa')
    tb_curve = tff_test_utils.tensorboard_values(
        logdir, 'aequa/width_accuracy_test')
    self.assertEqual(sorted(tb_curve), [25, 50, 75, 100])
    for width, accuracy in curve.items():
      self.assertAlmostEqual(float(tb_curve[round(width * 100)]), accuracy,
                             places=5)
    tb_contributions = tff_test_utils.tensorboard_values(
        logdir, 'aequa/contribution_by_rank')
    tb_widths = tff_test_utils.tensorboard_values(logdir,
                                                  'aequa/width_by_rank')
    for rank, cid in enumerate(by_contribution):
      self.assertAlmostEqual(float(tb_contributions[rank]),
                             contributions[cid], places=5)
      self.assertAlmostEqual(float(tb_widths[rank]), float(rows[cid]['width']),
                             places=5)
    for cid, row in rows.items():
      # The reward is the global model at the client's width.
      self.assertAlmostEqual(float(row['accuracy']),
                             curve[float(row['width'])])
      self.assertAlmostEqual(float(row['own_test_accuracy']),
                             result.evaluations['aequa'][cid].accuracy)
      self.assertAlmostEqual(float(row['gain']),
                             float(row['accuracy']) - contributions[cid])
    with open(os.path.join(run_dir, 'aequa_fairness.json')) as f:
      report = json.load(f)
    self.assertEqual(report['allocation_solver'], 'exact')
    self.assertIn('pearson', report)

  def test_server_held_out_sets_measure_curve_and_rewards(self):
    # A finished run resumed with server held-out sets keeps its model and
    # recomputes the rewards on them: the curve on the server's validation
    # set (300 examples), the rewarded accuracies on its test set (300),
    # instead of the clients' pooled validation (4 x 10) and test (4 x 20).
    out = self.create_tempdir().full_path
    path = os.path.join(out, 'contributions.json')
    with open(path, 'w') as f:
      json.dump({'client_0000': 0.35, 'client_0001': 0.1,
                 'client_0002': 0.5, 'client_0003': 0.2}, f)
    run_dir = os.path.join(out, 'run')

    def curve_and_global(**overrides):
      result = driver.run(_config(run_dir, examples_per_client=100,
                                  contributions_file=path, **overrides))
      with open(os.path.join(run_dir, 'width_accuracy.csv')) as f:
        rows = list(csv.DictReader(f))
      curve = np.array([[float(r['held_out_accuracy']),
                         float(r['test_accuracy'])] for r in rows])
      return curve, result.evaluations['global']

    def on_grid(values, n):  # Accuracies measured on n examples.
      return np.allclose(values * n, np.round(values * n), atol=1e-6)

    pooled, global_before = curve_and_global()
    self.assertTrue(on_grid(pooled[:, 0], 40))
    self.assertTrue(on_grid(pooled[:, 1], 80))
    server, global_after = curve_and_global(server_held_out_examples=300)
    self.assertTrue(on_grid(server[:, 0], 300))
    self.assertTrue(on_grid(server[:, 1], 300))
    self.assertFalse(on_grid(server[:, 0], 40) and on_grid(server[:, 1], 80))
    for cid, metrics in global_before.items():
      self.assertEqual(metrics.accuracy, global_after[cid].accuracy)

  def test_default_contributions_are_standalone_accuracy_on_held_out(self):
    # Without --contributions_file the driver trains every client alone and
    # measures each standalone model on the common held-out set the curve
    # is measured on (here: the clients' validation splits pooled), not on
    # the client's own test split. Under label skew the two differ sharply:
    # a two-class model is good on its own test split, but on the pool it
    # is right at most on its two classes' share of it.
    out = self.create_tempdir().full_path
    run_values = dict(
        algorithm='aequa', dataset='digits', partition='label_skew',
        classes_per_client=2, num_clients=4, clients_per_round=4, rounds=6,
        batch_size=16, client_learning_rate=0.1, p_min=0.25,
        width_step=0.25, seed=5, eval_every=0, output_dir=out,
        common_test_evaluation=True)
    config = registry.make_config(**run_values)
    trainer = driver.Trainer(driver.build_experiment(config))
    result = trainer.run()
    self.assertEqual(set(result.evaluations), {
        'global', 'standalone', 'aequa', 'global:common_test',
        'standalone:common_test', 'aequa:common_test'})
    with open(os.path.join(out, 'aequa_allocation.csv')) as f:
      allocation = list(csv.DictReader(f))
    contributions = {r['client']: float(r['contribution']) for r in allocation}
    # The common test set is the rewards' test set (the pooled test
    # splits): each client's rewarded model, at its width, scores there
    # what the allocation table says; on its own split what it says too.
    with open(os.path.join(out, 'aequa_fairness.json')) as f:
      fairness = json.load(f)
    self.assertEqual(fairness['ir_confidence'], 0.95)
    for r in allocation:
      self.assertAlmostEqual(
          result.evaluations['aequa:common_test'][r['client']].accuracy,
          float(r['accuracy']), places=6)
      self.assertAlmostEqual(
          result.evaluations['aequa'][r['client']].accuracy,
          float(r['own_test_accuracy']), places=6)
      # Gains and IR are judged like with like: the rewarded model and the
      # standalone model on the same common test set.
      self.assertAlmostEqual(
          result.evaluations['standalone:common_test'][r['client']].accuracy,
          float(r['test_contribution']), places=6)
      self.assertAlmostEqual(
          float(r['gain']),
          float(r['accuracy']) - float(r['test_contribution']), places=6)
      # The width served clears the held-out contribution by its margin.
      if r['client'] not in fairness['ir_infeasible']:
        self.assertGreater(float(r['ir_margin']), 0)
        self.assertGreaterEqual(
            float(r['held_out_accuracy']),
            float(r['contribution']) + float(r['ir_margin']))
    self.assertEqual(fairness['ir_violations'],
                     sum(float(r['gain']) < 0 for r in allocation))
    data = trainer.experiment.data
    self.assertEqual(set(contributions), set(data.client_ids))
    pooled = [data.arrays(cid, 'validation') for cid in data.client_ids]
    held_out = (np.concatenate([x for x, _ in pooled]),
                np.concatenate([y for _, y in pooled]))
    n = len(held_out[1])
    # Measured on the n pooled validation examples.
    values = np.array(list(contributions.values()))
    np.testing.assert_allclose(values * n, np.round(values * n), atol=1e-6)
    own_test = result.evaluations['standalone']
    for cid, contribution in contributions.items():
      classes = np.unique(data.arrays(cid, 'train')[1])
      share = np.isin(held_out[1], classes).mean()
      self.assertLessEqual(contribution, share + 1e-9)
    self.assertGreater(
        np.mean([m.accuracy for m in own_test.values()]),
        np.mean(values) + 0.3)
    # The same standalone models (same seeds), measured on the pool.
    models = trainer.context.train_locally(
        trainer.experiment.plain_model_spec.initial_weights(config.seed),
        trainer.context.standalone_epochs(), tag=0)
    plain = trainer.context.variant_evaluator(experiment_lib.PLAIN)
    expected = plain.evaluate_clients(models, data.client_ids,
                                      lambda _: held_out)
    for cid, contribution in contributions.items():
      self.assertAlmostEqual(contribution, expected[cid].accuracy,
                             delta=1.5 / n)
    # The contributions go out in the form --contributions_file reads: the
    # finished run re-rewarded from that file allocates the same widths,
    # without training the clients alone again.
    contributions_path = os.path.join(out, 'aequa_contributions.json')
    with open(contributions_path) as f:
      self.assertEqual(json.load(f), contributions)
    rerewarded = driver.run(registry.make_config(
        **run_values, contributions_file=contributions_path))
    self.assertNotIn('standalone', rerewarded.evaluations)
    with open(os.path.join(out, 'aequa_allocation.csv')) as f:
      self.assertEqual({r['client']: r['width'] for r in csv.DictReader(f)},
                       {r['client']: r['width'] for r in allocation})

  def test_bad_contributions(self):
    out = self.create_tempdir().full_path
    path = os.path.join(out, 'contributions.json')
    for content, message in (
        ('{"client_0000": 0.5}', 'no contribution for 3 client'),
        ('{"client_0000": NaN, "client_0001": 0.1, "client_0002": 0.1,'
         ' "client_0003": 0.1}', 'not a finite number'),
        ('[1, 2]', 'JSON object')):
      with open(path, 'w') as f:
        f.write(content)
      with self.assertRaisesRegex(config_lib.ConfigError, message):
        driver.Trainer(driver.build_experiment(
            _config(os.path.join(out, 'run'), contributions_file=path)
        ))._aequa_rewards(None)


if __name__ == '__main__':
  tf.test.main()
