"""Which architecture each client trains: `--client_models`, shared.

For algorithms whose clients train models of different architectures
(FedDF, FedMD): `--client_models` names the architectures and each one's
share of the clients (`lenet:0.5,ditto_cnn:0.5`). The shares become whole
clients by largest remainders (`client_counts`), given to the clients in an
order shuffled by the run's seed (`assign_architectures`), so the
assignment does not follow the partition's order. `--model` must be one of
the architectures (its model is the one the driver calls the global
model); an empty `--client_models` gives every client `--model`.
"""

import collections
import math
from typing import Any

import numpy as np

from tff_fair.models import names as model_names
from tff_fair.training import config as config_lib

# Separates the architectures' shuffle of clients from the run's others
# (the value FedDF's runs were made with).
_ASSIGNMENT_STREAM = 0xFEDDF


def client_models_setting() -> Any:
  """The `client_models` field of a settings dataclass (one name, one
  meaning wherever it is read)."""
  return config_lib.setting(
      '', "the clients' architectures and each one's share of the clients,"
      ' e.g. lenet:0.5,ditto_cnn:0.5 (shares are normalized; --model must be'
      ' one of them); empty: every client uses --model.')


def parse_client_models(text: str) -> collections.OrderedDict:
  """'lenet:0.5,ditto_cnn:0.5' -> OrderedDict(architecture -> share).

  Shares are positive numbers, normalized to sum to 1; a name alone has
  share 1.

  Raises:
    config.ConfigError: For an unknown or repeated architecture, or a share
      that is not a positive number.
  """
  shares = collections.OrderedDict()
  for item in text.split(','):
    name, _, share = item.strip().partition(':')
    if name not in model_names.PLAIN_MODELS:
      raise config_lib.ConfigError(
          f'--client_models={text}: unknown architecture {name!r}; use'
          f' name:share pairs of {", ".join(model_names.PLAIN_MODELS)},'
          ' e.g. lenet:0.5,ditto_cnn:0.5.')
    if name in shares:
      raise config_lib.ConfigError(
          f'--client_models={text} names {name} twice.')
    try:
      value = float(share) if share else 1.0
    except ValueError:
      value = math.nan
    if not (math.isfinite(value) and value > 0):
      raise config_lib.ConfigError(
          f'--client_models={text}: the share of {name} must be a number'
          f' > 0, got {share!r}.')
    shares[name] = value
  total = sum(shares.values())
  return collections.OrderedDict((n, s / total) for n, s in shares.items())


def main_model(config: config_lib.RunConfig) -> str:
  """`--model`, or the data set's default architecture."""
  return config.model or config_lib.DATASET_DEFAULTS[config.dataset].model


def architecture_shares(config: config_lib.RunConfig
                        ) -> collections.OrderedDict:
  """Architecture -> its share of the clients (`--model` alone if unset)."""
  if config.settings.client_models:
    return parse_client_models(config.settings.client_models)
  return collections.OrderedDict([(main_model(config), 1.0)])


def client_counts(shares: collections.OrderedDict,
                  num_clients: int) -> collections.OrderedDict:
  """Clients per architecture: the shares in whole clients, by largest
  remainders (ties to the earlier architecture)."""
  exact = [s * num_clients for s in shares.values()]
  counts = [math.floor(e) for e in exact]
  by_remainder = sorted(range(len(exact)), key=lambda i: -(exact[i] -
                                                           counts[i]))
  for i in by_remainder[:num_clients - sum(counts)]:
    counts[i] += 1
  return collections.OrderedDict(zip(shares, counts))


def assign_architectures(client_ids, shares: collections.OrderedDict,
                         seed: int) -> dict[str, str]:
  """Client id -> its architecture: `client_counts` over the clients in a
  seeded shuffled order."""
  order = np.random.default_rng([seed, _ASSIGNMENT_STREAM]).permutation(
      len(client_ids))
  counts = client_counts(shares, len(client_ids))
  names = [n for n, count in counts.items() for _ in range(count)]
  return {client_ids[i]: name for i, name in zip(order, names)}


def check_client_models(config: config_lib.RunConfig) -> None:
  """For `Recipe.check_config`: `--model` among the architectures, and
  every architecture with at least one client.

  Raises:
    config.ConfigError: Naming the flags that disagree.
  """
  shares = architecture_shares(config)
  if main_model(config) not in shares:
    raise config_lib.ConfigError(
        f'--model={main_model(config)} is not one of --client_models='
        f'{config.settings.client_models}: set --model to one of'
        f' {", ".join(shares)} (its model is the run\'s global model).')
  counts = client_counts(shares, config.num_clients)
  empty = [name for name, count in counts.items() if not count]
  if empty:
    raise config_lib.ConfigError(
        f'--client_models={config.settings.client_models} gives no client'
        f' of --num_clients={config.num_clients} to {", ".join(empty)}:'
        ' raise its share or the number of clients.')


def model_variants(config: config_lib.RunConfig) -> dict[str, str]:
  """For `Recipe.model_variants`: each architecture, as a variant of its
  own name."""
  return {name: name for name in architecture_shares(config)}
