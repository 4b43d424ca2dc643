"""Bad inputs are refused before anything is written or trained.

One table of bad settings, files named by flags, model/data pairings and
output directories, run in-process through exactly the checks `driver.run`
makes before its first write (`RunConfig`, then `driver.prepare`). Each case
asserts the error type (a `UserError`, which programs/train.py maps to exit
status 2), the key words of its one-line message, the time to fail, and
that the output directory is byte-for-byte as it was (or not created).
tests/programs/train_bad_inputs_test.py runs a handful through the program.
"""

import json
import math
import os
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from tests import snapshot as snapshot_lib
from tff_fair import errors
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training.recipes import registry
from tff_fair.training import run_dir

# Digits with 4 clients: ids client_0000 .. client_0003.
_CLIENTS = [f'client_{i:04d}' for i in range(4)]
# Generous for 2 shared cores; training a round takes longer than this.
_MAX_SECONDS = 30.0


def _write(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def _values(**changes):
  values = {cid: 0.5 for cid in _CLIENTS}
  values.update(changes)
  return json.dumps(values)


def _saved_config(out, **overrides):
  """A config.json of a digits run in `out`, as tff_fair writes it."""
  values = dict(_BASE, output_dir=out)
  values.update(overrides)
  _write(os.path.join(out, 'config.json'),
         json.dumps(registry.make_config(**values).to_dict()))


def _checkpoint(out, round_num):
  os.makedirs(os.path.join(out, 'checkpoints', f'program_state_{round_num}'))


_BASE = dict(dataset='digits', partition='dirichlet', alpha=0.5,
             num_clients=4, clients_per_round=4, rounds=2, batch_size=16,
             eval_every=0, seed=3)

# (name, settings, setup(out, files) -> more settings, key words).
# `out` is the run's --output_dir (absent unless setup makes it); `files`
# is a folder for input files.
_CASES = (
    # Settings alone.
    ('seed_too_large', dict(seed=2**64), None, ['seed must be in']),
    ('unknown_model', dict(model='junk'), None, ['Unknown model', 'junk']),
    ('slimmable_model_without_aequa', dict(model='slimmable_lenet'), None,
     ['--model=slimmable_lenet', '--algorithm=aequa']),
    ('attack_scale_nan', dict(attack='model_replacement',
                              malicious_fraction=0.5,
                              attack_scale=math.nan), None,
     ['attack_scale must be a finite number']),
    ('negative_alpha', dict(alpha=-1.0), None, ['alpha must be > 0']),
    ('too_many_sampled', dict(clients_per_round=9), None,
     ['clients_per_round=9', 'num_clients=4']),
    ('zero_rounds', dict(rounds=0), None, ['rounds must be >= 1']),
    ('fractions', dict(validation_fraction=0.5, test_fraction=0.5), None,
     ['sum to less than 1']),
    ('lambda_nan', dict(algorithm='ditto', ditto_lambda=math.nan), None,
     ['ditto_lambda', 'lambda must be']),
    ('widths', dict(algorithm='aequa', p_min=0.9, p_max=0.5), None,
     ['p_min=0.9 exceeds p_max=0.5']),
    ('unknown_dataset', dict(dataset='imagenet'), None, ['Unknown dataset']),
    # The data: partition and splits.
    ('more_clients_than_examples', dict(num_clients=2000,
                                        clients_per_round=2000), None,
     ['--num_clients=2000', 'at most 1797']),
    ('classes_per_client_above_classes', dict(partition='label_skew',
                                              classes_per_client=11), None,
     ['classes_per_client', '10']),
    ('server_held_out_too_large', dict(server_held_out_examples=5000,
                                       common_test_evaluation=True), None,
     ['server_held_out_examples=5000']),
    ('one_example_per_client', dict(examples_per_client=1), None,
     ['no test examples', '--examples_per_client=1']),
    ('lambda_grid_without_validation', dict(
        algorithm='ditto', ditto_lambda_grid='0.1,1', validation_fraction=0.0),
     None, ['ditto_lambda_grid', 'validation_fraction is 0']),
    ('data_dir_is_a_file', dict(dataset='mnist'),
     lambda out, files: dict(data_dir=_file(files)), ['is a file']),
    ('data_dir_missing', dict(dataset='mnist'),
     lambda out, files: dict(data_dir=os.path.join(files, 'nowhere')),
     ['does not exist']),
    # The model against the data.
    ('text_model_on_images', dict(model='text_cnn'), None,
     ['--model=text_cnn', 'token ids', 'images of shape (8, 8, 1)']),
    ('sequence_model_on_images', dict(model='char_lstm'), None,
     ['--model=char_lstm', 'token ids']),
    ('cifar_model_too_deep_for_8x8', dict(model='cifar_cnn'), None,
     ['--model=cifar_cnn cannot read --dataset=digits']),
    # Files named by flags.
    ('contributions_missing_file', dict(algorithm='aequa'),
     lambda out, files: dict(contributions_file=os.path.join(files, 'no.json')),
     ['Cannot read', 'no.json']),
    ('contributions_empty', dict(algorithm='aequa'),
     lambda out, files: dict(contributions_file=_file(files, '')),
     ['Cannot read', 'JSON object']),
    ('contributions_nan', dict(algorithm='aequa'),
     lambda out, files: dict(contributions_file=_file(
         files, _values(client_0002=math.nan))),
     ['client_0002', 'not a finite number']),
    ('contributions_not_numbers', dict(algorithm='aequa'),
     lambda out, files: dict(contributions_file=_file(
         files, _values(client_0001='high'))),
     ['client_0001', "'high'", 'not a finite number']),
    ('contributions_missing_client', dict(algorithm='aequa'),
     lambda out, files: dict(contributions_file=_file(
         files, json.dumps({'client_0000': 0.5}))),
     ['has no contribution for 3 client(s)']),
    ('contributions_unknown_client', dict(algorithm='aequa'),
     lambda out, files: dict(contributions_file=_file(
         files, _values(client_9999=0.1))),
     ['client_9999', 'does not have']),
    ('iafl_contributions_missing_client', dict(algorithm='iafl'),
     lambda out, files: dict(contributions_file=_file(
         files, json.dumps({'client_0000': 0.5}))),
     ['has no contribution for 3 client(s)']),
    ('iafl_contributions_and_data_size', dict(algorithm='iafl',
                                              iafl_contribution='data_size'),
     lambda out, files: dict(contributions_file=_file(files, _values())),
     ['--iafl_contribution=data_size', '--contributions_file',
      'give one of them']),
    ('contributions_not_an_object', dict(algorithm='aequa'),
     lambda out, files: dict(contributions_file=_file(files, '[0.5, 0.5]')),
     ['JSON list', 'JSON object']),
    ('lambdas_negative', dict(algorithm='ditto'),
     lambda out, files: dict(ditto_lambdas_file=_file(
         files, _values(client_0003=-1))),
     ["client_0003", 'lambda must be']),
    ('lambdas_missing_client', dict(algorithm='ditto'),
     lambda out, files: dict(ditto_lambdas_file=_file(files, '{}')),
     ['has no lambda for 4 client(s)']),
    # Another algorithm's setting (would be ignored), good file or not.
    ('contributions_file_with_ditto', dict(algorithm='ditto'),
     lambda out, files: dict(contributions_file=_file(files, _values())),
     ['--contributions_file=', 'setting of --algorithm=aequa',
      '--algorithm=ditto ignores']),
    ('lambdas_file_with_fedavg', dict(algorithm='fedavg'),
     lambda out, files: dict(ditto_lambdas_file=_file(files, _values())),
     ['--ditto_lambdas_file=', 'setting of --algorithm=ditto',
      '--algorithm=fedavg ignores']),
    ('missing_lambdas_file_with_aequa', dict(algorithm='aequa'),
     lambda out, files: dict(ditto_lambdas_file=os.path.join(files, 'no')),
     ['--ditto_lambdas_file=', 'setting of --algorithm=ditto']),
    ('lambda_grid_with_fedavg_ft', dict(algorithm='fedavg_ft',
                                        ditto_lambda_grid='0.1,1'), None,
     ['--ditto_lambda_grid=0.1,1', 'setting of --algorithm=ditto',
      '--algorithm=fedavg_ft ignores']),
    ('p_min_with_ditto', dict(algorithm='ditto', p_min=0.25), None,
     ['--p_min=0.25', 'setting of --algorithm=aequa']),
    ('finetune_epochs_with_standalone', dict(algorithm='standalone',
                                             finetune_epochs=3), None,
     ['--finetune_epochs=3', 'setting of --algorithm=fedavg_ft']),
    # A setting the chosen aggregator, attack or partition does not read.
    ('dp_noise_with_mean', dict(dp_noise_multiplier=0.5), None,
     ['--dp_noise_multiplier=0.5', 'read only with --aggregator=dp']),
    ('classes_per_client_with_dirichlet', dict(classes_per_client=3), None,
     ['--classes_per_client=3', 'read only with --partition=label_skew',
      'not with --partition=dirichlet']),
    ('kappa_with_label_skew', dict(partition='label_skew', kappa=0.8), None,
     ['--kappa=0.8', 'read only with --partition=quantity_skew']),
    # The output directory.
    ('output_dir_is_a_file', {},
     lambda out, files: dict(output_dir=_file(files)),
     ['is a file, not a directory']),
    ('output_dir_under_a_file', {},
     lambda out, files: dict(output_dir=os.path.join(_file(files), 'run')),
     ['cannot be created', 'is a file']),
    ('config_json_not_an_object', {},
     lambda out, files: _write(os.path.join(out, 'config.json'), '[1, 2]'),
     ['config.json holds a JSON list']),
    ('config_json_damaged', {},
     lambda out, files: _write(os.path.join(out, 'config.json'), '{"ro'),
     ['config.json is not valid JSON']),
    ('other_settings', {},
     lambda out, files: (_saved_config(out, seed=4), _checkpoint(out, 1)),
     ['other settings', 'seed: saved run has 4, this run asks 3']),
    ('checkpoints_missing_beside_outputs', {},
     lambda out, files: (_saved_config(out),
                         _write(os.path.join(out, 'metrics.csv'), 'round\n')),
     ['checkpoints', 'missing', '--start_over']),
    ('personal_models_without_checkpoints', dict(algorithm='ditto'),
     lambda out, files: (_saved_config(out, algorithm='ditto'), _write(
         os.path.join(out, 'personal', 'manifests', 'v3.json'), '{}')),
     ['personal/', 'checkpoints', 'missing']),
    ('checkpoints_without_config', {},
     lambda out, files: _checkpoint(out, 2),
     ['no config.json', '--start_over']),
    ('checkpoint_past_rounds', {},
     lambda out, files: (_saved_config(out), _checkpoint(out, 7)),
     ['round 7, past rounds=2', '--rounds=7']),
    ('checkpoints_is_a_file', {},
     lambda out, files: _write(os.path.join(out, 'checkpoints'), ''),
     ['checkpoints is a file']),
)


def _file(folder, text='x'):
  path = os.path.join(folder, f'file{len(os.listdir(folder))}')
  _write(path, text)
  return path


class BadInputsTest(parameterized.TestCase):

  @parameterized.named_parameters(*_CASES)
  def test_refused_before_anything_is_written(self, settings, setup,
                                              keywords):
    out = os.path.join(self.create_tempdir().full_path, 'run')
    files = self.create_tempdir().full_path
    values = dict(_BASE, output_dir=out, **settings)
    if setup is not None:
      more = setup(out, files)
      if isinstance(more, dict):
        values.update(more)
    before = snapshot_lib.snapshot(values['output_dir'])
    start = time.monotonic()
    with self.assertRaises(errors.UserError) as raised:
      config = registry.make_config(**values)
      driver.prepare(config)
    seconds = time.monotonic() - start
    message = str(raised.exception)
    for keyword in keywords:
      self.assertIn(keyword, message)
    if 'other settings' not in message:  # That one lists each setting.
      self.assertNotIn('\n', message)
    self.assertLess(seconds, _MAX_SECONDS)
    self.assertEqual(snapshot_lib.snapshot(values['output_dir']), before)

  def test_read_only_file_system(self):
    out = self.create_tempdir().full_path
    real = os.statvfs

    def read_only(path):
      result = real(path)
      return mock.Mock(f_flag=result.f_flag | os.ST_RDONLY)

    with mock.patch.object(run_dir.os, 'statvfs', read_only):
      with self.assertRaisesRegex(run_dir.RunDirError,
                                  'read-only file system'):
        driver.prepare(registry.make_config(**dict(
            _BASE, output_dir=os.path.join(out, 'run'))))
    self.assertFalse(os.path.exists(os.path.join(out, 'run')))

  def test_good_inputs_pass_the_same_checks(self):
    files = self.create_tempdir().full_path
    out = os.path.join(self.create_tempdir().full_path, 'run')
    plan, experiment = driver.prepare(registry.make_config(**dict(
        _BASE, output_dir=out, algorithm='aequa',
        contributions_file=_file(files, _values()))))
    self.assertEqual(plan.kind, 'new')
    self.assertEqual(experiment.data.client_ids, tuple(_CLIENTS))
    self.assertFalse(os.path.exists(out))
    # The largest seed, and Aequa's ResNet-18 (its plain version is itself
    # at full width), are accepted.
    registry.make_config(**dict(_BASE, output_dir=out,
                                seed=config_lib.MAX_SEED))
    _, experiment = driver.prepare(registry.make_config(**dict(
        _BASE, output_dir=out, algorithm='aequa',
        model='slimmable_resnet18')))
    self.assertEqual(experiment.plain_model_spec.name, 'slimmable_resnet18')

  def test_unstarted_run_is_replaced_by_the_corrected_command(self):
    # A start that failed before its first checkpoint left config.json
    # only: the corrected command (other settings) is not refused.
    out = self.create_tempdir().full_path
    _saved_config(out, seed=4, examples_per_client=1)
    config = registry.make_config(**dict(_BASE, output_dir=out))
    plan, _ = driver.prepare(config)
    self.assertEqual(plan.kind, 'unstarted')
    plan.apply()
    self.assertEqual(config_lib.load_saved(out)['seed'], 3)

  def test_start_over_discards_only_the_saved_run(self):
    out = self.create_tempdir().full_path
    _saved_config(out)
    _write(os.path.join(out, 'metrics.csv'), 'round\n')
    _write(os.path.join(out, 'notes.txt'), 'mine')
    config = registry.make_config(**dict(_BASE, output_dir=out, seed=5))
    plan, _ = driver.prepare(config, start_over=True)
    self.assertEqual(plan.kind, 'start_over')
    plan.apply()
    self.assertEqual(sorted(os.listdir(out)), ['config.json', 'notes.txt'])
    self.assertEqual(config_lib.load_saved(out)['seed'], 5)


if __name__ == '__main__':
  absltest.main()
