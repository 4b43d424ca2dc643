"""What the recipe tests share: a small digits run, its round logs, a run
killed midway."""

from collections.abc import Sequence
import csv
import os
from typing import Any, Optional
from unittest import mock

import numpy as np
import tensorflow as tf

from tff_fair import attacks
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training.recipes import registry


class Killed(Exception):
  """Stands for the process being killed."""


def assert_same_state(test: Any, state: Any, other: Any) -> None:
  """Fails `test` unless two server states are equal byte for byte."""
  flat, other_flat = (tf.nest.flatten(s) for s in (state, other))
  test.assertLen(other_flat, len(flat))
  for a, b in zip(flat, other_flat):
    test.assertEqual(a.tobytes(), b.tobytes())


def run_keeping_state(recipe_type: type[Any], config: config_lib.RunConfig,
                      kill_in_round: Optional[int] = None
                      ) -> tuple[Any, Any]:
  """Runs `config`; returns its result and the server state (numpy) its
  final evaluations saw.

  Args:
    recipe_type: The run's recipe class.
    config: The run.
    kill_in_round: Raise `Killed` in this round after the recipe's
      `after_round` (its logs written), before the round's checkpoint.
  """
  states = []
  final_evaluations = recipe_type.final_evaluations
  after_round = recipe_type.after_round

  def keep_state(recipe, state, global_weights):
    states.append(tf.nest.map_structure(np.asarray, state))
    return final_evaluations(recipe, state, global_weights)

  def killed_after_writing(recipe, plan, output):
    released = after_round(recipe, plan, output)
    if plan.number == kill_in_round:
      raise Killed()
    return released

  with mock.patch.object(recipe_type, 'final_evaluations', keep_state), \
      mock.patch.object(recipe_type, 'after_round', killed_after_writing):
    result = driver.run(config)
  return result, states[-1]


def digits_config(output_dir: str, **overrides) -> config_lib.RunConfig:
  """4 digits clients, all sampled, 3 rounds; one poisons its labels (A1).

  Args:
    output_dir: The run's directory.
    **overrides: Settings, `algorithm` among them.
  """
  values = dict(
      dataset='digits', partition='homogeneous',
      num_clients=4, clients_per_round=4, rounds=3, batch_size=16,
      client_learning_rate=0.1, seed=3, output_dir=output_dir, eval_every=0,
      attack='label_poisoning', malicious_fraction=0.25)
  values.update(overrides)
  return registry.make_config(**values)


def standalone_evaluations(test: tf.test.TestCase, model: str,
                           same_clients_as: config_lib.RunConfig,
                           **settings) -> dict[str, Any]:
  """Each client's own model of architecture `model` trained alone
  (`--algorithm=standalone` with `settings` on digits), evaluated.

  Checks first that its clients' test splits are those of
  `same_clients_as` (a run whose server draws sets no client holds must not
  change the clients' splits), so the two runs' accuracies compare.
  """
  config = digits_config(test.create_tempdir().full_path,
                         algorithm='standalone', model=model, **settings)
  other = driver.build_experiment(same_clients_as).data
  data = driver.build_experiment(config).data
  for cid in data.client_ids:
    test.assertAllEqual(data.indices(cid, 'test'), other.indices(cid, 'test'))
  return driver.run(config).evaluations['standalone']


def read_round_log(output_dir: str, file_name: str) -> list[dict[str, str]]:
  """The rows of a CSV the run wrote."""
  with open(os.path.join(output_dir, file_name)) as f:
    return list(csv.DictReader(f))


def run_texts(output_dir: str, file_names: Sequence[str] = (), *,
              missing_ok: bool = False) -> dict[str, Any]:
  """What a run wrote, without its timings, to compare two runs.

  'metrics.csv': its rows without the `seconds*` columns; each of
  `file_names`: its text. With `missing_ok` a file the run did not write is
  left out; otherwise opening it fails.
  """
  texts = {}
  for name in ('metrics.csv', *file_names):
    path = os.path.join(output_dir, name)
    if missing_ok and not os.path.exists(path):
      continue
    if name == 'metrics.csv':
      texts[name] = [
          {k: v for k, v in row.items() if not k.startswith('seconds')}
          for row in read_round_log(output_dir, name)]
    else:
      with open(path) as f:
        texts[name] = f.read()
  return texts


# One or more values other than the default for every algorithm-dependent
# shared setting (`config.ALGORITHM_DEPENDENT`), most telling first: a run
# that reads the setting must come out different with the first value its
# algorithm reads (settings_read_test). Enums list every other choice.
NON_DEFAULT_VALUES = {
    'clients_per_round': (3,),  # Of the 4 clients of `read_check_config`.
    'local_epochs': (2,),
    'batch_size': (7,),
    'client_optimizer': ('adam', 'sgdm', 'adamw'),
    'client_learning_rate': (0.03,),
    'server_optimizer': ('adam', 'sgdm', 'adamw'),
    'server_learning_rate': (0.5,),
    # DP noise changes any round; a robust aggregator may clip nothing in a
    # first round.
    'aggregator': ('dp', 'compression', 'robust'),
    'attack': (attacks.RANDOM_UPDATES, attacks.MODEL_REPLACEMENT,
               attacks.LABEL_POISONING),
    'eval_every': (2,),  # No evaluation in a 1-round run.
    'server_held_out_examples': (40,),
    'public_examples': (50,),
}
# What a value needs besides (an attack needs attackers).
COMPANIONS = {'attack': {'malicious_fraction': 0.25}}


def read_check_config(output_dir: str, algorithm: str,
                      **overrides) -> config_lib.RunConfig:
  """One round of 4 digits clients, evaluated: the run settings_read_test
  changes one setting of at a time.
  """
  values = dict(
      algorithm=algorithm, dataset='digits', partition='homogeneous',
      num_clients=4, clients_per_round=4, rounds=1, batch_size=8,
      examples_per_client=40, seed=3, output_dir=output_dir, eval_every=1)
  values.update(overrides)
  return registry.make_config(**values)
