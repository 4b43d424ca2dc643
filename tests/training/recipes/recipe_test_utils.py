"""What the recipe tests share: a small digits run and its round logs."""

import csv
import os

from tff_fair import attacks
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import registry


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


def read_round_log(output_dir: str, file_name: str) -> list[dict[str, str]]:
  """The rows of a recipe's per-round CSV."""
  with open(os.path.join(output_dir, file_name)) as f:
    return list(csv.DictReader(f))


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
