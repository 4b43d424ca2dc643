"""Every shared setting a recipe declares as read changes its run.

A recipe's `reads` is what makes a run refuse the settings its algorithm
ignores (tests/programs/unread_settings_test.py). Here the other half: a
declaration cannot lie. For every recipe of the registry and every
algorithm-dependent setting it declares, a one-round digits run with the
first non-default value it reads (`recipe_test_utils.NON_DEFAULT_VALUES`)
must come out different from the same run with the defaults: in the
released round metrics, the algorithm's own outputs or the global model
after the round (a setting that acts only after the last round: the final
per-client metrics and outputs of a whole run). A repeat of the default
run must come out the same, so a difference means something.
"""

import hashlib

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests import tff_test_utils
from tests.training.recipes import recipe_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training.recipes import registry

# Cheaper runs that read the same settings: Aequa's final allocation on a
# coarse width grid; standalone's budget of local epochs
# (`RunContext.standalone_epochs`) rounded from more rounds, so that
# clients_per_round changes it.
# FedDF's distillation shortened.
_CHEAPER = {'aequa': {'width_step': 0.3}, 'standalone': {'rounds': 4},
            'feddf': {'feddf_distillation_steps': 20,
                      'feddf_validate_every': 10}}
# The runs train the FedAvg paper's small MLP where the algorithm takes a
# plain model: what a setting changes does not depend on the architecture,
# and it builds and runs in about three quarters of LeNet's time.
_MODEL = 'mlp'
# Settings that act only after the last round (the common held-out sets).
_FINAL_ONLY = frozenset({'server_held_out_examples'})


def _declared(algorithm: str) -> list[tuple[str, object]]:
  """(setting, value): each declared setting with the first value it reads."""
  config = recipe_test_utils.read_check_config('unused', algorithm,
                                               **_settings(algorithm))
  reads = registry.get(algorithm).settings_read(config)
  cases = []
  for setting in config_lib.ALGORITHM_DEPENDENT:
    read = [v for v in recipe_test_utils.NON_DEFAULT_VALUES[setting]
            if config_lib.reads_value(reads, setting, v)]
    if read:
      cases.append((setting, read[0]))
  return cases


def _settings(algorithm: str, **overrides) -> dict[str, object]:
  """The algorithm's required and cheaper settings, then `overrides`."""
  recipe = registry.get(algorithm)
  model = {} if recipe.slimmable else {'model': _MODEL}
  return {**model, **recipe.required_settings,
          **_CHEAPER.get(algorithm, {}), **overrides}


def _outputs(output_dir: str, algorithm: str) -> tuple[str, ...]:
  """What a run released and wrote, without its timings."""
  texts = recipe_test_utils.run_texts(
      output_dir, ('clients_final.csv', *registry.get(algorithm).output_files),
      missing_ok=True)
  return tuple(f'{name}:\n{text}' for name, text in texts.items())


def _digest(weights) -> str:
  """A digest of model weights."""
  digest = hashlib.sha256()
  for array in tf.nest.flatten(weights):
    digest.update(np.asarray(array).tobytes())
  return digest.hexdigest()


class DeclaredSettingsActTest(tff_test_utils.TffTestCase):

  def _run(self, algorithm: str, whole: bool, **overrides) -> tuple[str, ...]:
    """The outputs of a run; without `whole`, its round alone (no final
    evaluations) and the global model it ends with."""
    config = recipe_test_utils.read_check_config(
        self.create_tempdir().full_path, algorithm,
        **_settings(algorithm, **overrides))
    if whole or not registry.get(algorithm).trains_federated:
      driver.run(config)
      return _outputs(config.output_dir, algorithm)
    plan, experiment = driver.prepare(config)
    plan.apply()
    trainer = driver.Trainer(experiment)
    state, _, _ = trainer.train()
    return (*_outputs(config.output_dir, algorithm),
            _digest(trainer.process.get_model_weights(state)))

  def test_every_dependent_setting_has_test_values(self):
    self.assertCountEqual(recipe_test_utils.NON_DEFAULT_VALUES,
                          config_lib.ALGORITHM_DEPENDENT)

  @parameterized.named_parameters(
      (name, name) for name in registry.names())
  def test_each_declared_setting_changes_the_run(self, algorithm):
    declared = _declared(algorithm)
    self.assertNotEmpty(declared)
    defaults = {}
    for setting, value in declared:
      whole = setting in _FINAL_ONLY
      if whole not in defaults:
        defaults[whole] = self._run(algorithm, whole)
        self.assertEqual(self._run(algorithm, whole), defaults[whole],
                         'the default run does not repeat')
      with self.subTest(setting=setting, value=value):
        changed = self._run(algorithm, whole, **{
            setting: value, **recipe_test_utils.COMPANIONS.get(setting, {})})
        self.assertNotEqual(
            changed, defaults[whole],
            f'--algorithm={algorithm} declares --{setting} as read, but'
            f' --{setting}={value} leaves its run unchanged')


if __name__ == '__main__':
  tf.test.main()
