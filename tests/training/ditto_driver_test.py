"""Ditto through the round driver: persistence, resume, lambdas, attacks."""

import csv
import json
import os
from unittest import mock

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests import snapshot as snapshot_lib
from tests import tff_test_utils
from tff_fair.evaluation import per_client
from tff_fair.runtime import remote
from tff_fair.state import client_store
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training.recipes import ditto as ditto_recipe
from tff_fair.training.recipes import registry
from tff_fair.training import run_dir
from tff_fair.training import sampling


def _config(output_dir, **overrides):
  values = dict(
      algorithm='ditto', dataset='digits', model='mlp',
      partition='label_skew', classes_per_client=2, num_clients=4,
      clients_per_round=2, rounds=3,
      batch_size=16, client_learning_rate=0.1, personal_learning_rate=0.1,
      seed=11, output_dir=output_dir, eval_every=0)
  values.update(overrides)
  return registry.make_config(**values)


def _trainer(config):
  config_lib.save_if_new(config)
  return driver.Trainer(driver.build_experiment(config))


def _accuracies(result, kind):
  return np.array([m.accuracy for m in result.evaluations[kind].values()])


def _spy(process, name, record):
  """Patches `process.<name>` (a property) with a recording wrapper."""
  original = getattr(process, name)

  def wrapper(*args):
    result = original(*args)
    record.append((args, result))
    return result

  return mock.patch.object(type(process), name,
                           new=property(lambda _: wrapper))


def _validation_loss(spec, weights, x, y):
  """Mean cross-entropy of `weights` on (x, y), by Keras directly."""
  model = spec.build_keras(None)
  weights.assign_weights_to(model)
  return float(tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True)(y, model(x, training=False)))


def _damage_checkpoint(output_dir, round_num):
  """Truncates the variables of the checkpoint of `round_num`."""
  os.truncate(os.path.join(run_dir.checkpoint_path(output_dir, round_num),
                           'variables', 'variables.data-00000-of-00001'),
              1000)


def _personal_arrays(output_dir, round_num):
  """Client -> its personal model's arrays in the manifest of `round_num`."""
  store = os.path.join(output_dir, ditto_recipe.PERSONAL_DIR)
  with open(os.path.join(store, 'manifests', f'v{round_num}.json')) as f:
    clients = json.load(f)['clients']
  arrays = {}
  for cid, entry in sorted(clients.items()):
    path = os.path.join(store, 'clients', client_store._client_key(cid),
                        f'v{entry["version"]}.npz')
    with np.load(path) as npz:
      arrays[cid] = [npz[f'a{i}'] for i in range(len(npz.files))]
  return arrays


def _read_csv(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


class DittoDriverTest(tff_test_utils.TffTestCase):

  def test_resume_and_fallback_give_the_same_personal_models(self):
    settings = dict(personal_optimizer='adam', personal_learning_rate=0.01,
                    personal_epochs=2)
    straight_dir = self.create_tempdir().full_path
    straight = driver.run(_config(straight_dir, rounds=4, **settings))
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
    # The store keeps the versions of the checkpointed rounds 3 and 4 (0
    # is the empty store), and only the files they reference.
    store = os.path.join(out, 'personal')
    self.assertEqual(client_store.committed_versions(store), [3, 4])
    referenced = set()
    for version in (3, 4):
      with open(os.path.join(store, 'manifests', f'v{version}.json')) as f:
        referenced.update(
            (client_store._client_key(cid), f'v{e["version"]}.npz')
            for cid, e in json.load(f)['clients'].items())
    on_disk = {(key, name)
               for key in os.listdir(os.path.join(store, 'clients'))
               for name in os.listdir(os.path.join(store, 'clients', key))}
    self.assertEqual(on_disk, referenced)

    # The latest checkpoint damaged: the fallback resumes from round 3 with
    # round 3's personal models and ends exactly as the straight run.
    _damage_checkpoint(out, 4)
    fallback = driver.run(_config(out, rounds=4, **settings),
                          checkpoint_fallback=True)
    self.assertEqual(fallback.resumed_from_round, 3)
    self.assertEqual(fallback.history[0]['train_loss'],
                     straight.history[3]['train_loss'])
    for kind in ('global', 'personalized'):
      self.assertAllEqual(_accuracies(fallback, kind),
                          _accuracies(straight, kind))
    expected = _personal_arrays(straight_dir, 4)
    got = _personal_arrays(out, 4)
    self.assertEqual(list(got), list(expected))
    for cid, arrays in expected.items():
      for a, b in zip(got[cid], arrays):
        self.assertAllEqual(a, b)

    # A store of an older tff_fair kept the latest version only: the
    # fallback is refused, saying why, and nothing is changed.
    os.remove(os.path.join(store, 'manifests', 'v3.json'))
    _damage_checkpoint(out, 4)
    before = snapshot_lib.snapshot(out)
    with self.assertRaisesRegex(
        run_dir.RunDirError,
        'not usable: round 3 .its per-client state .personal/. was not kept'):
      driver.run(_config(out, rounds=4, **settings),
                 checkpoint_fallback=True)
    self.assertEqual(snapshot_lib.snapshot(out), before)

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
    round1 = sampling.sample_clients(ids, 2, seed=11, round_num=1)
    round2 = sampling.sample_clients(ids, 2, seed=11, round_num=2)
    initial = trainer.experiment.model_spec.initial_weights(11)
    # Round 1: every client is new and starts from w^0.
    for client_input in seen_inputs[0]:
      self.assertAllClose(client_input['personal'].trainable,
                          initial.trainable)
    personal = trainer.recipe.own_models
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
      sampled.update(sampling.sample_clients(data.client_ids, 3, seed=11,
                                           round_num=round_num))
    self.assertNotEmpty(read)
    self.assertContainsSubset(set(read), sampled)
    self.assertLen(os.listdir(os.path.join(config.output_dir, 'personal',
                                           'clients')), len(sampled))

  def test_personalize_is_anchored_at_the_global_model_before_next(self):
    trainer = _trainer(_config(self.create_tempdir().full_path, rounds=2))
    state, _ = trainer._restore()
    process = trainer.process
    personalized, stepped = [], []
    with _spy(process, 'personalize', personalized), \
         _spy(process, 'next', stepped):
      trainer._run_rounds(state, 0)
    anchors = [process.get_model_weights(args[0]).trainable
               for args, _ in personalized]
    after_next = [process.get_model_weights(out.state).trainable
                  for _, out in stepped]
    self.assertLen(anchors, 2)
    self.assertAllClose(
        anchors[0],
        trainer.experiment.model_spec.initial_weights(11).trainable)
    # Round 2 is anchored at w^1 (round 1's result), not at w^2.
    self.assertAllClose(anchors[1], after_next[0])
    self.assertNotAllClose(anchors[1], after_next[1])

  @parameterized.parameters((1,), (0,))
  def test_lambda_is_the_validation_arg_min_rechosen_as_configured(
      self, every):
    grid = (0.01, 10.0)
    out = self.create_tempdir().full_path
    trainer = _trainer(_config(
        out, rounds=2, clients_per_round=4, ditto_lambda_every=every,
        ditto_lambda_grid=','.join(str(v) for v in grid)))
    state, _ = trainer._restore()
    calls = []
    with _spy(trainer.process, 'personalize', calls):
      trainer._run_rounds(state, 0)
    data = trainer.experiment.data
    spec = trainer.experiment.model_spec
    ids = data.client_ids  # All four clients train in every round.
    rows = _read_csv(os.path.join(out, 'personal_rounds.csv'))
    chosen = {(int(r['round']), r['client']): float(r['lambda'])
              for r in rows}
    self.assertLen(chosen, 8)
    models = {}  # (round, client) -> the model the round kept.
    for round_num, ((_, inputs), outputs) in enumerate(calls, start=1):
      rechoose = round_num == 1 or every == 1
      self.assertLen(inputs, len(ids) * (len(grid) if rechoose else 1))
      for i, cid in enumerate(ids):
        if not rechoose:
          job, = [i]
          self.assertEqual(inputs[job]['lam'], chosen[(1, cid)])
          self.assertEqual(chosen[(2, cid)], chosen[(1, cid)])
          models[(round_num, cid)] = outputs[job]['personal']
          continue
        jobs = range(i * len(grid), (i + 1) * len(grid))
        self.assertEqual([inputs[j]['lam'] for j in jobs], list(grid))
        x, y = data.arrays(cid, 'validation')
        losses = {inputs[j]['lam']: _validation_loss(
            spec, outputs[j]['personal'], x, y) for j in jobs}
        self.assertEqual(chosen[(round_num, cid)], min(losses,
                                                       key=losses.get),
                         (round_num, cid, losses))
        best = jobs[grid.index(chosen[(round_num, cid)])]
        models[(round_num, cid)] = outputs[best]['personal']
        if round_num == 2:
          # Candidates start from the client's current personal model.
          for j in jobs:
            self.assertAllClose(inputs[j]['personal'].trainable,
                                models[(1, cid)].trainable)
    for row in rows:
      rechosen = int(row['round']) == 1 or every == 1
      self.assertEqual(int(row['lambda_chosen']), int(rechosen))
    for cid in ids:
      self.assertEqual(trainer.recipe.lam(cid), chosen[(2, cid)])
      self.assertAllClose(trainer.recipe.own_models.weights(cid).trainable,
                          models[(2, cid)].trainable)

  def test_choose_lambda_is_the_arg_min_and_skips_nan(self):
    self.assertEqual(ditto_recipe.choose_lambda({0.1: 0.5, 1.0: 0.2, 2.0: 0.3}),
                     1.0)
    self.assertEqual(ditto_recipe.choose_lambda({0.1: float('nan'), 1.0: 0.9}),
                     1.0)
    self.assertEqual(ditto_recipe.choose_lambda({2.0: 0.4, 1.0: 0.4}), 1.0)

  def test_round_metrics_evaluate_the_round_s_personal_models(self):
    out = self.create_tempdir().full_path
    result = driver.run(_config(out, rounds=2, eval_every=1))
    last = result.history[-1]
    final = per_client.summarize_clients(result.evaluations['personalized'])
    # The same clients and the same (round-2) personal models.
    self.assertEqual(last['test_accuracy_count'], final['accuracy'].count)
    self.assertAllClose(last['test_loss_mean'], final['loss'].mean)
    self.assertAllClose(last['test_accuracy_mean'], final['accuracy'].mean)
    released = _read_csv(os.path.join(out, 'metrics.csv'))
    self.assertAllClose(float(released[-1]['test_loss_mean']),
                        final['loss'].mean)

  def test_never_sampled_clients_are_not_scored_as_personalized(self):
    out = self.create_tempdir().full_path
    result = driver.run(_config(out, rounds=1, clients_per_round=1,
                                eval_every=1))
    trained = sampling.sample_clients(
        [f'client_{i:04d}' for i in range(4)], 1, seed=11, round_num=1)
    self.assertEqual(list(result.evaluations['personalized']), trained)
    self.assertLen(result.evaluations['personalized_or_global'], 4)
    self.assertEqual(result.history[0]['personal_clients_untrained'], 3)
    self.assertEqual(result.history[0]['test_accuracy_count'], 1)
    self.assertEqual(result.history[0]['global_test_accuracy_count'], 4)
    with open(os.path.join(out, 'summary.json')) as f:
      summary = json.load(f)
    self.assertEqual(summary['personalized']['accuracy']['count'], 1)
    self.assertEqual(
        summary['personalized_or_global']['accuracy']['count'], 4)

  def test_personal_round_log_shows_the_end_of_round_model(self):
    out = self.create_tempdir().full_path
    config = _config(out, rounds=2, eval_every=1)
    trainer = _trainer(config)
    result = trainer.run()
    rows = _read_csv(os.path.join(out, 'personal_rounds.csv'))
    ids = trainer.experiment.data.client_ids
    for round_num in (1, 2):
      self.assertEqual(
          [r['client'] for r in rows if int(r['round']) == round_num],
          sampling.sample_clients(ids, 2, seed=11, round_num=round_num))
    evaluator = per_client.ClientEvaluator(
        trainer.experiment.model_spec.build_keras)
    data = trainer.experiment.data
    for row in rows:
      if int(row['round']) != 2:
        continue
      cid = row['client']
      on_train = evaluator.evaluate(trainer.recipe.own_models.weights(cid),
                                    *data.arrays(cid, 'train'))
      self.assertAllClose(float(row['train_accuracy']), on_train.accuracy)
      self.assertAllClose(float(row['train_loss']), on_train.loss)
      self.assertGreater(float(row['train_loss_during']), 0.0)
      self.assertEqual(float(row['lambda']), config.settings.ditto_lambda)
    round2 = [r for r in rows if int(r['round']) == 2]
    self.assertAllClose(result.history[-1]['personal_train_accuracy_min'],
                        min(float(r['train_accuracy']) for r in round2))
    # Rows of a round without a checkpoint (a kill after the rows, before
    # the checkpoint) are dropped on resume, and the round's rows rewritten.
    with open(os.path.join(out, 'personal_rounds.csv'), 'a') as f:
      f.write('3,client_0000,0,1.0,0,9,9,0.1,9,0.1\n')
    driver.run(_config(out, rounds=3, eval_every=1))
    rows = _read_csv(os.path.join(out, 'personal_rounds.csv'))
    self.assertEqual(
        [r['client'] for r in rows if int(r['round']) == 3],
        sampling.sample_clients(ids, 2, seed=11, round_num=3))
    self.assertLen(rows, 6)

  def test_interleaved_rounds_run_in_one_pass_and_equal_two(self):
    # The interleaved variant trains both models in `personalize_and_next`
    # (a lambda grid's choosing rounds and a multi-worker context take two
    # computations); both ways give the same models and round logs.
    settings = dict(ditto_variant='interleaved', rounds=2, eval_every=1,
                    attack='model_replacement', malicious_fraction=0.25)
    runs = {}
    for fused in (True, False):
      out = self.create_tempdir().full_path
      trainer = _trainer(_config(out, **settings))
      fake_remote = mock.Mock(wraps=remote)
      fake_remote.is_multi_worker.return_value = not fused
      personalized, paired = [], []
      with mock.patch.object(ditto_recipe, 'remote', fake_remote), \
           _spy(trainer.process, 'personalize', personalized), \
           _spy(trainer.process, 'personalize_and_next', paired):
        result = trainer.run()
      self.assertLen(paired, 2 if fused else 0)
      self.assertLen(personalized, 0 if fused else 2)
      runs[fused] = (result, _personal_arrays(out, 2),
                     _read_csv(os.path.join(out, 'personal_rounds.csv')))
    (fused, fused_arrays, fused_rows), (two, two_arrays, two_rows) = (
        runs[True], runs[False])
    self.assertNotEmpty(fused.malicious)
    for kind in ('global', 'personalized'):
      self.assertAllClose(_accuracies(fused, kind), _accuracies(two, kind))
    for a, b in zip(fused.history, two.history):
      self.assertAllClose(a['train_loss'], b['train_loss'], rtol=1e-5)
      self.assertAllClose(a['test_accuracy_mean'], b['test_accuracy_mean'])
    self.assertEqual(list(fused_arrays), list(two_arrays))
    for cid, arrays in fused_arrays.items():
      self.assertAllClose(arrays, two_arrays[cid], atol=1e-5, rtol=1e-4)
    self.assertEqual([r['client'] for r in fused_rows],
                     [r['client'] for r in two_rows])
    self.assertAllClose(
        [float(r['train_loss_during']) for r in fused_rows],
        [float(r['train_loss_during']) for r in two_rows], rtol=1e-5)
    self.assertIn('seconds_personal_and_global_train', fused.history[0])
    self.assertIn('seconds_personal_train', two.history[0])

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
                                malicious_fraction=0.5, clients_per_round=4,
                                eval_every=1))
    with open(os.path.join(out, 'summary.json')) as f:
      summary = json.load(f)
    for kind in ('global', 'personalized'):
      self.assertEqual(summary[f'{kind}:benign']['accuracy']['count'], 2)
      self.assertEqual(summary[f'{kind}:malicious']['accuracy']['count'], 2)
    self.assertLen(result.evaluations['personalized'], 4)
    # Per-round statistics count the benign clients only.
    benign = sorted(set(result.evaluations['global']) - result.malicious)
    self.assertLen(benign, 2)
    released = result.history[0]
    for prefix in ('', 'global_'):
      self.assertEqual(released[f'{prefix}test_accuracy_count'], 2)
    personal = {cid: m.accuracy for cid, m in
                result.evaluations['personalized'].items()}
    self.assertAllClose(released['test_accuracy_mean'],
                        np.mean([personal[cid] for cid in benign]))
    rows = _read_csv(os.path.join(out, 'personal_rounds.csv'))
    benign_train = [float(r['train_accuracy']) for r in rows
                    if r['malicious'] == '0']
    self.assertLen(benign_train, 2)
    self.assertAllClose(released['personal_train_accuracy_min'],
                        min(benign_train))


if __name__ == '__main__':
  tf.test.main()
