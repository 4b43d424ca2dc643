"""A setting the chosen algorithm would ignore stops the program with exit 2.

Enumerated from the registry, not kept by hand: for every recipe, every
algorithm-dependent shared setting (`config.ALGORITHM_DEPENDENT`) and every
non-default value of it (`recipe_test_utils.NON_DEFAULT_VALUES`) that the
recipe does not read, `programs.train` exits 2 before any data is loaded
(the driver is never called), with one error line naming the flag and the
algorithm. (Its other half, that every declared setting acts, is
tests/training/recipes/settings_read_test.py.)
"""

from unittest import mock

from absl import logging
from absl.testing import absltest
from absl.testing import parameterized

from programs import train
from tests.training.recipes import recipe_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import registry


def _base_flags(algorithm: str) -> dict[str, object]:
  return dict(algorithm=algorithm, dataset='digits', num_clients=4,
              output_dir='/nonexistent/never_written',
              **registry.get(algorithm).required_settings)


def _unread_cases():
  """(name, algorithm, setting, value) for every refusal there should be."""
  for algorithm, recipe_type in registry.RECIPES.items():
    config = registry.make_config(**_base_flags(algorithm),
                                  clients_per_round=4)
    reads = recipe_type.settings_read(config)
    for setting in config_lib.ALGORITHM_DEPENDENT:
      for value in recipe_test_utils.NON_DEFAULT_VALUES[setting]:
        if not config_lib.reads_value(reads, setting, value):
          yield (f'{algorithm}_{setting}_{value}', algorithm, setting, value)


def _run_program(**flags) -> tuple[int, list[str], mock.MagicMock]:
  """(exit status, logged error lines, the driver's `run`) of one call."""
  train.FLAGS.unparse_flags()
  argv = train.parse_flags(
      ['train'] + [f'--{name}={value}' for name, value in flags.items()])
  errors = []
  with mock.patch.object(train.driver, 'run') as run, mock.patch.object(
      logging, 'error', lambda fmt, *args: errors.append(fmt % args)):
    try:
      train.main(argv)
      status = 0
    except SystemExit as e:
      status = e.code
  return status, errors, run


class UnreadSettingsTest(parameterized.TestCase):

  def test_the_enumeration_is_not_empty(self):
    # Standalone alone ignores the server and aggregator settings.
    cases = list(_unread_cases())
    self.assertNotEmpty([c for c in cases if c[1] == 'standalone'])
    self.assertIn(('cgsv_aggregator_dp', 'cgsv', 'aggregator', 'dp'), cases)

  @parameterized.named_parameters(_unread_cases())
  def test_refused_before_any_data_is_loaded(self, algorithm, setting,
                                             value):
    status, errors, run = _run_program(**_base_flags(algorithm), **{
        setting: value, **recipe_test_utils.COMPANIONS.get(setting, {})})
    self.assertEqual(status, 2)
    run.assert_not_called()
    self.assertLen(errors, 1)
    self.assertIn(f'--{setting}={value} would be ignored', errors[0])
    self.assertIn(f'--algorithm={algorithm}', errors[0])
    self.assertNotIn('\n', errors[0])

  @parameterized.named_parameters(
      (name, name) for name in registry.names())
  def test_what_it_reads_is_accepted(self, algorithm):
    # The same program call without the unread setting reaches the driver.
    status, errors, run = _run_program(**_base_flags(algorithm))
    self.assertEqual((status, errors), (0, []))
    run.assert_called_once()

  def test_help_names_the_algorithms_that_ignore_each_setting(self):
    for setting in config_lib.ALGORITHM_DEPENDENT:
      help_text = train.FLAGS[setting].help
      for algorithm, recipe_type in registry.RECIPES.items():
        if setting not in recipe_type.reads:
          self.assertRegex(help_text, rf'Ignored \(refused\) by[^.]*\b{algorithm}\b',
                           setting)
        elif recipe_type.reads[setting] is not None:
          self.assertIn(f'{algorithm} reads only', help_text)


class RuntimeSettingsTest(parameterized.TestCase):
  """Runtime flags an executor or an algorithm could not act on."""

  @parameterized.named_parameters(
      (name, name) for name, r in registry.RECIPES.items()
      if not r.runs_on_several_workers)
  def test_per_client_outputs_refuse_several_workers_before_connecting(
      self, algorithm):
    # Nothing listens on these ports: the refusal comes before connecting.
    status, errors, run = _run_program(
        **_base_flags(algorithm), executor='remote',
        workers='127.0.0.1:1,127.0.0.1:2')
    self.assertEqual(status, 2)
    run.assert_not_called()
    self.assertLen(errors, 1)
    self.assertIn(f'--algorithm={algorithm} cannot split its clients over 2'
                  ' workers', errors[0])
    self.assertIn('--executor=local', errors[0])

  def test_local_concurrency_with_remote_workers_is_refused(self):
    status, errors, run = _run_program(
        **_base_flags('fedavg'), executor='remote', workers='127.0.0.1:1',
        max_concurrent_computation_calls=2)
    self.assertEqual(status, 2)
    run.assert_not_called()
    self.assertIn('--max_concurrent_computation_calls=2 would be ignored',
                  errors[0])

  def test_an_impossible_privacy_budget_is_refused_before_any_data(self):
    status, errors, run = _run_program(
        **_base_flags('fedavg'), aggregator='dp', clients_per_round=2,
        rounds=50, dp_target_epsilon=1.0)
    self.assertEqual(status, 2)
    run.assert_not_called()
    self.assertLen(errors, 1)
    self.assertIn('dp_target_epsilon=1 cannot be reached in 50 rounds of 2'
                  ' of 4 clients', errors[0])
    self.assertIn('Sample more clients per round', errors[0])
    status, errors, _ = _run_program(
        **_base_flags('fedavg'), aggregator='dp', dp_noise_multiplier=0.3,
        dp_target_epsilon=5.0)
    self.assertEqual(status, 2)
    self.assertIn('Give either --dp_noise_multiplier=0.3 or'
                  ' --dp_target_epsilon=5.0, not both', errors[0])

  def test_zero_concurrency_is_refused(self):
    status, errors, _ = _run_program(
        **_base_flags('fedavg'), max_concurrent_computation_calls=0)
    self.assertEqual(status, 2)
    self.assertIn('max_concurrent_computation_calls must be -1 (unlimited)'
                  ' or >= 1, got 0', errors[0])


if __name__ == '__main__':
  # The program's --output_dir is required; each test gives its own.
  train.FLAGS.set_default('output_dir', 'unused')
  absltest.main()
