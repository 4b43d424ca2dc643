"""RunConfig validation and the resume-compatibility check."""

import dataclasses
import json
import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized

from tests import tff_test_utils
from tff_fair import errors
from tff_fair.data import partition
from tff_fair.data.sources import registry as source_registry
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import registry


class RunConfigTest(parameterized.TestCase):

  def _config(self, **overrides):
    values = dict(output_dir=self.create_tempdir().full_path)
    values.update(overrides)
    return registry.make_config(**values)

  @parameterized.named_parameters(
      ('unknown_algorithm', dict(algorithm='fedfoo'), 'Unknown algorithm'),
      ('unknown_partition', dict(partition='random'), 'Unknown partition'),
      ('zero_rounds', dict(rounds=0), 'rounds must be >= 1'),
      ('too_many_sampled', dict(num_clients=5, clients_per_round=6),
       'exceeds num_clients'),
      ('negative_lr', dict(client_learning_rate=-0.1),
       'client_learning_rate must be a positive'),
      ('nan_lr', dict(server_learning_rate=float('nan')),
       'server_learning_rate must be a positive'),
      ('alpha_zero', dict(alpha=0.0), 'alpha must be > 0'),
      ('alpha_nan', dict(alpha=float('nan')), 'alpha must be > 0'),
      ('kappa', dict(partition='quantity_skew', kappa=1.0),
       r'kappa must be in \(0, 1\)'),
      ('quantity_clients', dict(partition='quantity_skew',
                                quantity_clients=10),
       'quantity_clients must be in'),
      ('fractions', dict(validation_fraction=0.5, test_fraction=0.5),
       'sum to less than 1'),
      ('no_test', dict(test_fraction=0.0), 'test_fraction must be > 0'),
      ('optimizer', dict(client_optimizer='rmsprop'),
       'Unknown client_optimizer'),
      ('dataset', dict(dataset='imagenet'), 'Unknown dataset .*digits'),
      ('p_order', dict(algorithm='aequa', p_min=0.8, p_max=0.5), 'p_min=0.8 exceeds p_max=0.5'),
      ('p_range', dict(algorithm='aequa', p_min=0.0), r'Widths must be in \(0, 1\]'),
      ('p_max_range', dict(algorithm='aequa', p_max=1.5), r'Widths must be in \(0, 1\]'),
      ('width_step', dict(algorithm='aequa', width_step=0.0), 'width_step'),
      ('lambda_negative', dict(algorithm='ditto', ditto_lambda=-0.5), 'lambda must be'),
      ('lambda_nan', dict(algorithm='ditto', ditto_lambda=float('nan')), 'lambda must be'),
      ('lambda_grid', dict(algorithm='ditto', ditto_lambda_grid='0.1,x'), 'comma-separated'),
      ('lambda_grid_negative', dict(algorithm='ditto',
                                    ditto_lambda_grid='0.1,-1'),
       'lambda must be'),
      ('lambda_every', dict(algorithm='ditto', ditto_lambda_every=-1),
       'ditto_lambda_every must be >= 0'),
      ('grid_without_validation', dict(algorithm='ditto',
                                       ditto_lambda_grid='0.1,1',
                                       validation_fraction=0.0),
       'validation_fraction is 0'),
      ('personal_iterate', dict(algorithm='ditto', personal_iterate='best'),
       'Unknown personal_iterate .*average, last'),
      ('attack_without_fraction', dict(attack='label_poisoning'),
       'needs malicious_fraction'),
      ('solver', dict(algorithm='aequa', allocation_solver='greedy'),
       'Unknown allocation_solver'),
      ('ir_certain', dict(algorithm='aequa', ir_confidence=1.0),
       r'ir_confidence must lie in \[0.5, 1\), got 1.0'),
      ('ir_below_half', dict(algorithm='aequa', ir_confidence=0.3),
       r'ir_confidence must lie in \[0.5, 1\), got 0.3'),
      ('server_held_out', dict(server_held_out_examples=-5),
       'server_held_out_examples must be >= 0'),
      ('rotated_all', dict(rotated_client_fraction=1.0),
       r'rotated_client_fraction must be in \[0, 1\), got 1.0'),
      ('label_skew_rule', dict(label_skew_rule='shards'),
       'Unknown label_skew_rule .*niid_bench, cyclic'),
      ('quantity_large_clients', dict(quantity_large_clients='last'),
       'Unknown quantity_large_clients .*random, first'),
      ('kappa_scope', dict(kappa_scope='all'),
       'Unknown kappa_scope .*shared, each'),
      ('kappa_each', dict(partition='quantity_skew', kappa_scope='each',
                          kappa=0.4, quantity_clients=3),
       'kappa_scope=each .*quantity_clients=3.*kappa_scope=shared'),
  )
  def test_bad_settings(self, overrides, message):
    with self.assertRaisesRegex(config_lib.ConfigError, message):
      self._config(**overrides)

  @parameterized.named_parameters(
      ('lambdas_file', 'fedavg', dict(ditto_lambdas_file='l.json'), 'ditto'),
      ('lambda_grid', 'aequa', dict(ditto_lambda_grid='0.1,1'), 'ditto'),
      ('personal_rate', 'fedavg_ft', dict(client_learning_rate=0.1,
                                          personal_learning_rate=0.3),
       'ditto or fedrep'),
      ('contributions_file', 'ditto', dict(contributions_file='c.json'),
       'aequa or iafl'),
      ('width_step', 'standalone', dict(width_step=0.05), 'aequa'),
      ('p_min', 'standalone', dict(p_min=0.2), 'aequa or aequa_rewards'),
      ('finetune_epochs', 'ditto', dict(finetune_epochs=3), 'fedavg_ft'),
  )
  def test_another_algorithm_s_setting_is_refused(self, algorithm, setting,
                                                  owner):
    name = list(setting)[-1]
    first = owner.split(' or ')[0]  # The one suggested when several share it.
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        f'^--{name}=.* is a setting of --algorithm={owner}, which'
        f' --algorithm={algorithm} ignores; drop --{name} or use'
        f' --algorithm={first}.$'):
      self._config(algorithm=algorithm, **setting)
    self._config(algorithm=first, **setting)  # Its own algorithm's.

  @parameterized.named_parameters(
      ('dp_noise', dict(dp_noise_multiplier=0.5), 'aggregator', 'mean',
       'dp'),
      ('attack_scale', dict(attack='label_poisoning', malicious_fraction=0.2,
                            attack_scale=3.0), 'attack', 'label_poisoning',
       'model_replacement'),
      ('alpha', dict(partition='label_skew', alpha=0.3), 'partition',
       'label_skew', 'dirichlet'),
      ('kappa', dict(kappa=0.7), 'partition', 'dirichlet', 'quantity_skew'),
      ('classes', dict(partition='homogeneous', classes_per_client=3),
       'partition', 'homogeneous', 'label_skew'),
  )
  def test_setting_nothing_reads_is_refused(self, setting, other, value,
                                            user):
    name = list(setting)[-1]
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        f'^--{name}=.* is read only with --{other}={user}, not with'
        f' --{other}={value}; drop --{name} or use --{other}={user}.$'):
      self._config(**setting)
    self._config(**dict(setting, **{other: user}))  # Read there.

  def test_another_algorithm_s_settings_at_their_defaults_pass(self):
    # As the program passes every flag; a config passes again when replaced.
    defaults = {field.name: field.default
                for field, _ in registry.setting_fields()}
    for algorithm in registry.names():
      config = self._config(algorithm=algorithm, client_learning_rate=0.2,
                            **registry.get(algorithm).required_settings,
                            **defaults)
      dataclasses.replace(config, rounds=3)
      self.assertEqual(config.algorithm, algorithm)
      self.assertIsInstance(config.settings,
                            registry.get(algorithm).Settings)

  def test_flat_settings_round_trip(self):
    # config.json is flat: shared and own settings side by side.
    config = self._config(algorithm='ditto', ditto_lambda=0.3, rounds=4)
    values = config.to_dict()
    self.assertEqual((values['ditto_lambda'], values['rounds']), (0.3, 4))
    self.assertEqual(registry.make_config(**values), config)

  def test_output_dir_required(self):
    with self.assertRaisesRegex(config_lib.ConfigError, 'output_dir'):
      registry.make_config()

  def test_dataset_names_match_the_data_layer(self):
    self.assertEqual(set(config_lib.DATASETS), set(source_registry.SOURCE_NAMES))

  def test_partition_rules_match_the_data_layer(self):
    self.assertEqual(config_lib.LABEL_SKEW_RULES, partition.LABEL_SKEW_RULES)
    self.assertEqual(config_lib.QUANTITY_LARGE_CLIENTS,
                     partition.QUANTITY_LARGE_CLIENTS)
    self.assertEqual(config_lib.KAPPA_SCOPES,
                     partition.QUANTITY_KAPPA_SCOPES)

  def test_config_imports_no_tensorflow(self):
    # Settings are checked before TensorFlow's slow start-up.
    code = ('import sys; import tff_fair.training.config;'
            ' print(sorted(m for m in sys.modules'
            " if m.split('.')[0] in ('tensorflow', 'tensorflow_federated')))")
    result = subprocess.run([sys.executable, '-c', code], check=True,
                            capture_output=True, text=True,
                            env=tff_test_utils.subprocess_env())
    self.assertEqual(result.stdout.strip(), '[]')

  def test_seed_range(self):
    self._config(seed=config_lib.MAX_SEED)
    with self.assertRaisesRegex(config_lib.ConfigError, 'seed must be in'):
      self._config(seed=config_lib.MAX_SEED + 1)

  def test_config_errors_are_user_errors(self):
    self.assertTrue(issubclass(config_lib.ConfigError, errors.UserError))

  def test_width_grid(self):
    config = self._config(algorithm='aequa', p_min=0.1, p_max=1.0,
                          width_step=0.05)
    grid = config.settings.width_grid()
    self.assertLen(grid, 19)
    self.assertAlmostEqual(grid[0], 0.1)
    self.assertAlmostEqual(grid[-1], 1.0)
    self.assertEqual(self._config(algorithm='aequa', p_min=0.3,
                                  width_step=0.5).settings.width_grid(),
                     (0.3, 0.8, 1.0))

  def test_partition_params(self):
    self.assertEqual(self._config(alpha=0.3).partition_params(),
                     {'alpha': 0.3, 'top_up': False})
    self.assertEqual(
        self._config(dirichlet_top_up=True).partition_params()['top_up'],
        True)
    self.assertEqual(
        self._config(partition='label_skew',
                     classes_per_client=3).partition_params(),
        {'classes_per_client': 3, 'rule': 'niid_bench'})
    self.assertEqual(
        self._config(partition='quantity_skew', kappa=0.2,
                     quantity_clients=2, quantity_large_clients='first',
                     kappa_scope='each').partition_params(),
        {'kappa': 0.2, 'm': 2, 'large_clients': 'first',
         'kappa_scope': 'each'})

  def test_default_width_step_is_the_benchmarks(self):
    settings = self._config(algorithm='aequa', p_min=0.1).settings
    self.assertEqual(settings.width_step, 0.01)
    self.assertLen(settings.width_grid(), 91)


class CheckOrSaveTest(parameterized.TestCase):

  def test_first_run_saves_then_same_settings_resume(self):
    out = self.create_tempdir().full_path
    config = registry.make_config(output_dir=out, rounds=2)
    self.assertIsNone(config_lib.check_resumable(config))
    config_lib.save_if_new(config)
    with open(os.path.join(out, config_lib.CONFIG_FILE)) as f:
      self.assertEqual(json.load(f)['rounds'], 2)
    # More rounds is a legitimate extension of the same run.
    extended = registry.make_config(output_dir=out, rounds=7)
    self.assertEqual(config_lib.check_resumable(extended)['rounds'], 2)
    config_lib.save_if_new(extended)  # Keeps the first run's file.
    with open(os.path.join(out, config_lib.CONFIG_FILE)) as f:
      self.assertEqual(json.load(f)['rounds'], 2)

  def test_other_settings_refused_and_nothing_overwritten(self):
    out = self.create_tempdir().full_path
    config_lib.save_if_new(registry.make_config(output_dir=out))
    path = os.path.join(out, config_lib.CONFIG_FILE)
    with open(path) as f:
      before = f.read()
    other = registry.make_config(output_dir=out, num_clients=20,
                                 clients_per_round=5, seed=3)
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        r'(?s)clients_per_round: saved run has 10, this run asks 5.*'
        r'num_clients: saved run has 10, this run asks 20.*seed'):
      config_lib.check_resumable(other)
    with open(path) as f:
      self.assertEqual(f.read(), before)

  def test_setting_missing_from_an_older_run_counts_as_its_default(self):
    out = self.create_tempdir().full_path
    saved = registry.make_config(output_dir=out, rounds=2).to_dict()
    del saved['validation_fraction']  # As if saved before it existed.
    with open(os.path.join(out, config_lib.CONFIG_FILE), 'w') as f:
      json.dump(saved, f)
    config_lib.check_resumable(registry.make_config(output_dir=out, rounds=2))
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        'validation_fraction: saved run has 0.1, this run asks 0.3'):
      config_lib.check_resumable(registry.make_config(
          output_dir=out, rounds=2, validation_fraction=0.3))

  def _save_without(self, key, **settings):
    out = self.create_tempdir().full_path
    saved = registry.make_config(output_dir=out, **settings).to_dict()
    del saved[key]  # As if saved before the setting existed.
    with open(os.path.join(out, config_lib.CONFIG_FILE), 'w') as f:
      json.dump(saved, f)
    return out

  @parameterized.parameters(
      ('label_skew_rule', dict(partition='label_skew'), 'cyclic'),
      ('quantity_large_clients', dict(partition='quantity_skew'), 'first'),
      ('per_fedavg_hessian_product',
       dict(algorithm='per_fedavg', per_fedavg_variant='hf'),
       'finite_difference'),
  )
  def test_older_run_missing_a_rule_keeps_the_old_rule(
      self, key, settings, old):
    # The default rule changed: an older run resumes only with the rule it
    # was partitioned (or trained) with, and the refusal says which.
    out = self._save_without(key, **settings)
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        f"{key}: saved run has '{old}'.*predates the {key} setting.*"
        f'--{key}={old} to resume'):
      config_lib.check_resumable(registry.make_config(output_dir=out,
                                                      **settings))
    config_lib.check_resumable(registry.make_config(
        output_dir=out, **settings, **{key: old}))

  @parameterized.parameters(
      ('label_skew_rule', dict(partition='dirichlet')),
      ('quantity_large_clients', dict(partition='dirichlet')),
      ('per_fedavg_hessian_product', dict(algorithm='per_fedavg')))
  def test_rule_missing_where_it_does_not_act_is_default(self, key,
                                                         settings):
    out = self._save_without(key, **settings)
    config_lib.check_resumable(registry.make_config(output_dir=out,
                                                    **settings))

  def test_missing_kappa_scope_counts_as_shared(self):
    out = self._save_without('kappa_scope', partition='quantity_skew',
                             quantity_large_clients='first')
    config_lib.check_resumable(registry.make_config(
        output_dir=out, partition='quantity_skew',
        quantity_large_clients='first'))
    with self.assertRaisesRegex(config_lib.ConfigError,
                                "kappa_scope: saved run has 'shared'"):
      config_lib.check_resumable(registry.make_config(
          output_dir=out, partition='quantity_skew',
          quantity_large_clients='first', kappa_scope='each', kappa=0.2))

  def test_ditto_settings_of_an_older_run_count_as_defaults(self):
    out = self.create_tempdir().full_path
    saved = registry.make_config(output_dir=out, algorithm='ditto').to_dict()
    del saved['ditto_lambda_every'], saved['personal_iterate']
    with open(os.path.join(out, config_lib.CONFIG_FILE), 'w') as f:
      json.dump(saved, f)
    config_lib.check_resumable(
        registry.make_config(output_dir=out, algorithm='ditto'))
    with self.assertRaisesRegex(config_lib.ConfigError,
                                "personal_iterate: saved run has 'average'"):
      config_lib.check_resumable(registry.make_config(
          output_dir=out, algorithm='ditto', personal_iterate='last'))

  def test_server_held_out_sets_may_change_on_resumption(self):
    out = self.create_tempdir().full_path
    config_lib.save_if_new(registry.make_config(output_dir=out))
    config_lib.check_resumable(registry.make_config(
        output_dir=out, server_held_out_examples=1000,
        common_test_evaluation=True))

  def test_another_algorithm_s_saved_settings_are_not_compared(self):
    # Saved before such settings were refused: they never acted on the run.
    out = self.create_tempdir().full_path
    saved = registry.make_config(output_dir=out, rounds=2).to_dict()
    saved.update(p_min=0.25, ditto_lambda=0.5, personal_learning_rate=9.0)
    with open(os.path.join(out, config_lib.CONFIG_FILE), 'w') as f:
      json.dump(saved, f)
    config_lib.check_resumable(registry.make_config(output_dir=out, rounds=2))
    with self.assertRaisesRegex(config_lib.ConfigError,
                                "algorithm: saved run has 'fedavg'"):
      config_lib.check_resumable(registry.make_config(
          output_dir=out, rounds=2, algorithm='ditto'))

  def test_resume_compares_the_shared_settings_the_algorithm_reads(self):
    # Saved before unread settings were refused: standalone with a server
    # optimizer and an aggregator it never had, which must not block it.
    out = self.create_tempdir().full_path
    config = registry.make_config(output_dir=out, algorithm='standalone')
    saved = config.to_dict()
    saved.update(server_optimizer='adam', aggregator='dp', eval_every=0)
    with open(os.path.join(out, config_lib.CONFIG_FILE), 'w') as f:
      json.dump(saved, f)
    reads = registry.get('standalone').settings_read(config)
    config_lib.check_resumable(config, reads)
    # Without the declarations (every setting compared) it would block.
    with self.assertRaisesRegex(config_lib.ConfigError, 'aggregator'):
      config_lib.check_resumable(config)
    # What standalone reads still blocks: its budget of local epochs.
    changed = registry.make_config(output_dir=out, algorithm='standalone',
                                   local_epochs=2)
    with self.assertRaisesRegex(config_lib.ConfigError,
                                'local_epochs: saved run has 1'):
      config_lib.check_resumable(changed, reads)
    # And a setting FedAvg reads blocks a FedAvg run.
    fedavg = registry.make_config(output_dir=out)
    saved = fedavg.to_dict()
    saved['server_optimizer'] = 'adam'
    with open(os.path.join(out, config_lib.CONFIG_FILE), 'w') as f:
      json.dump(saved, f)
    with self.assertRaisesRegex(config_lib.ConfigError,
                                "server_optimizer: saved run has 'adam'"):
      config_lib.check_resumable(
          fedavg, registry.get('fedavg').settings_read(fedavg))

  def test_saved_settings_nothing_read_are_not_compared(self):
    # Saved before such settings were refused: they never acted on the run.
    out = self.create_tempdir().full_path
    saved = registry.make_config(output_dir=out, partition='label_skew',
                                 rounds=2).to_dict()
    saved.update(alpha=0.3, dp_noise_multiplier=2.0)
    with open(os.path.join(out, config_lib.CONFIG_FILE), 'w') as f:
      json.dump(saved, f)
    config_lib.check_resumable(registry.make_config(
        output_dir=out, partition='label_skew', rounds=2))
    with self.assertRaisesRegex(config_lib.ConfigError,
                                "partition: saved run has 'label_skew'"):
      config_lib.check_resumable(registry.make_config(
          output_dir=out, alpha=0.3, rounds=2))

  def test_damaged_config_file(self):
    out = self.create_tempdir().full_path
    with open(os.path.join(out, config_lib.CONFIG_FILE), 'w') as f:
      f.write('{"rounds": ')
    with self.assertRaisesRegex(config_lib.ConfigError, 'not valid JSON'):
      config_lib.check_resumable(registry.make_config(output_dir=out))



class DatasetDefaultsTest(absltest.TestCase):

  def test_unset_rates_and_batch_come_from_the_data_set(self):
    config = registry.make_config(algorithm='ditto', dataset='shakespeare',
                                  output_dir='x')
    self.assertEqual(config.batch_size, 4)
    self.assertEqual(config.client_learning_rate, 1.0)
    self.assertEqual(config.settings.personal_learning_rate, 1.0)
    config = registry.make_config(dataset='fashion_mnist', output_dir='x')
    self.assertEqual((config.batch_size, config.client_learning_rate),
                     (32, 0.05))
    # What config.json records, and so what a resume is checked against.
    self.assertEqual(config.to_dict()['client_learning_rate'], 0.05)

  def test_explicit_values_win(self):
    config = registry.make_config(
        algorithm='ditto', dataset='shakespeare', batch_size=16,
        client_learning_rate=0.5, personal_learning_rate=0.1, output_dir='x')
    self.assertEqual((config.batch_size, config.client_learning_rate,
                      config.settings.personal_learning_rate), (16, 0.5, 0.1))

  def test_personal_rate_follows_an_explicit_client_rate(self):
    config = registry.make_config(algorithm='ditto', dataset='digits',
                                  client_learning_rate=0.3, output_dir='x')
    self.assertEqual(config.settings.personal_learning_rate, 0.3)

  def test_every_data_set_has_defaults(self):
    self.assertCountEqual(config_lib.DATASET_DEFAULTS, config_lib.DATASETS)


if __name__ == '__main__':
  absltest.main()
