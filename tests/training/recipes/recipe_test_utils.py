"""What the recipe tests share: a small digits run and its round logs."""

import csv
import os

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
