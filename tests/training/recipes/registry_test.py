"""The recipe registry: names, settings and the configuration it builds."""

import dataclasses

from absl.testing import absltest

from tff_fair import attacks
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import recipe
from tff_fair.training.recipes import registry
from tff_fair.training import run_dir


class RegistryTest(absltest.TestCase):

  def test_names_and_classes_agree(self):
    self.assertIn(registry.DEFAULT_ALGORITHM, registry.names())
    for name, recipe_type in registry.RECIPES.items():
      self.assertEqual(recipe_type.name, name)
      self.assertTrue(issubclass(recipe_type, recipe.Recipe))
      self.assertTrue(dataclasses.is_dataclass(recipe_type.Settings))
      self.assertTrue(recipe_type.Settings.__dataclass_params__.frozen)

  def test_own_settings_never_shadow_shared_ones(self):
    shared = {f.name for f in dataclasses.fields(config_lib.RunConfig)}
    for field, owners in registry.setting_fields():
      self.assertNotIn(field.name, shared, owners)
      self.assertTrue(field.metadata['help'], field.name)
      if field.metadata['choices']:
        self.assertIn(field.default, field.metadata['choices'])

  def test_own_outputs_never_shadow_the_driver_s(self):
    generic = {*run_dir.RESULT_FILES, *run_dir.RESULT_DIRS,
               run_dir.CHECKPOINTS, config_lib.CONFIG_FILE}
    self.assertEmpty(generic & set(registry.output_files()))
    self.assertEmpty(generic & set(registry.client_state_dirs()))

  def test_declared_reads_are_shared_settings_and_their_values(self):
    choices = {'client_optimizer': config_lib.OPTIMIZERS,
               'server_optimizer': config_lib.OPTIMIZERS,
               'aggregator': config_lib.AGGREGATORS,
               'attack': attacks.ATTACKS}
    for name, recipe_type in registry.RECIPES.items():
      with self.subTest(name):
        self.assertContainsSubset(recipe_type.reads,
                                  config_lib.ALGORITHM_DEPENDENT)
        self.assertContainsSubset(recipe_type.ignored_because,
                                  config_lib.ALGORITHM_DEPENDENT)
        for setting, values in recipe_type.reads.items():
          if values is not None:
            self.assertContainsSubset(values, choices[setting])
            # The default is always read (it is never refused).
            self.assertIn(config_lib.RunConfig.__dataclass_fields__[
                setting].default, values)
        if not recipe_type.client_context:
          # Update attacks act inside a client computation with context.
          self.assertContainsSubset(
              recipe_type.reads.get('attack', ()),
              (attacks.NONE, attacks.LABEL_POISONING))

  def test_make_config_defaults_and_refusals(self):
    config = registry.make_config(output_dir='x')
    self.assertEqual(config.algorithm, registry.DEFAULT_ALGORITHM)
    self.assertIsInstance(config.settings,
                          registry.get(registry.DEFAULT_ALGORITHM).Settings)
    with self.assertRaisesRegex(config_lib.ConfigError,
                                'Unknown algorithm .fedfoo.; choose one of'):
      registry.make_config(algorithm='fedfoo', output_dir='x')
    with self.assertRaises(TypeError):  # A typo in code, not a user input.
      registry.make_config(output_dir='x', roundz=3)


if __name__ == '__main__':
  absltest.main()
