"""The one table of exit statuses in programs/train.py; its flag help."""

import dataclasses

from absl.testing import absltest

from programs import train
from tff_fair import data as data_lib
from tff_fair import errors
from tff_fair.models import names as model_names
from tff_fair.runtime import remote
from tff_fair.state import client_store
from tff_fair.training import config as config_lib
from tff_fair.training import run_dir
from tff_fair.training.recipes import registry


class ExitCodesTest(absltest.TestCase):

  def test_user_errors_exit_2(self):
    for error in (config_lib.ConfigError('x'), data_lib.DataError('x'),
                  data_lib.PartitionError('x'),
                  client_store.ClientStateError('x'),
                  remote.ExecutorConfigError('x'), run_dir.RunDirError('x'),
                  errors.UserError('x')):
      self.assertEqual(train.exit_code(error), 2, type(error).__name__)

  def test_lost_worker_exits_3(self):
    self.assertEqual(
        train.exit_code(remote.WorkerUnavailableError('h:1', 'gone')), 3)

  def test_internal_errors_keep_their_traceback(self):
    for error in (ValueError('x'), KeyError('x'), RuntimeError('x')):
      self.assertIsNone(train.exit_code(error))


class FlagHelpTest(absltest.TestCase):

  def test_model_help_lists_every_model(self):
    # What --helpfull prints for --model.
    help_text = train.FLAGS['model'].help
    for name in model_names.MODELS:
      self.assertRegex(help_text, rf'\b{name}\b')

  def test_every_algorithm_setting_is_a_flag_naming_its_algorithms(self):
    for field, owners in registry.setting_fields():
      flag = train.FLAGS[field.name]
      self.assertEqual(flag.default, field.default, field.name)
      # (absl puts an enum's choices first.)
      self.assertIn(f'{"/".join(owners)}: {field.metadata["help"]}',
                    flag.help)

  def test_helpfull_groups_flags_by_topic(self):
    by_module = {flag.name: module for module, flag_list in
                 train.FLAGS.flags_by_module_dict().items()
                 for flag in flag_list}
    settings = {field.name: owners
                for field, owners in registry.setting_fields()}
    shared = [f.name for f in dataclasses.fields(config_lib.RunConfig)
              if f.name != 'settings']
    for name in [*shared, *settings, 'executor', 'workers', 'start_over',
                 'checkpoint_fallback', 'max_concurrent_computation_calls']:
      with self.subTest(flag=name):
        if name in settings:
          # Under the algorithms that read it.
          self.assertEqual(by_module[name], '3. algorithm settings,'
                           ' --algorithm=' + ' or '.join(settings[name]))
        else:
          self.assertRegex(by_module[name], r'^[1245]\. [a-z ]+$')

  def test_help_shows_the_key_flags(self):
    # What --help lists: the program's key flags.
    key_flags = {f.name for f in
                 train.FLAGS.get_key_flags_for_module(train.__name__)}
    self.assertContainsSubset({'algorithm', 'dataset', 'output_dir'},
                              key_flags)


if __name__ == '__main__':
  # The program's --output_dir is required; this test parses no program.
  train.FLAGS.set_default('output_dir', 'unused')
  absltest.main()
