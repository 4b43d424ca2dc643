"""Which architecture each client trains: `--client_models`, shared.

For algorithms whose clients train models of different architectures
(FedDF, FedMD), in one of two ways:

* `--client_models` names the architectures and each one's share of the
  clients (`lenet:0.5,ditto_cnn:0.5`). The shares become whole clients by
  largest remainders (`client_counts`), given to the clients in an order
  shuffled by the run's seed (`assign_architectures`), so the assignment
  does not follow the partition's order.
* `--client_models_file` names a JSON file `{client_id: architecture}`
  covering every client (`load_client_models_file`).

`--model` must be one of the architectures (its model is the one the
driver calls the global model); with neither setting every client trains
`--model`. A recipe reads them through `architectures` and
`client_assignment`, and checks them with `check_settings` (its settings'
`__post_init__`), `check_client_models` (`check_config`) and
`check_client_files`; `SeveralArchitectures` gives a recipe the last, its
model variants and each client's architecture.
"""

import collections
from collections.abc import Sequence
import json
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


def client_models_file_setting() -> Any:
  """The `client_models_file` field of a settings dataclass."""
  return config_lib.setting(
      '', 'JSON file {client_id: architecture} giving every client its'
      ' architecture, instead of --client_models\' shares (--model must be'
      ' one of them).')


def check_settings(settings: Any) -> None:
  """For a settings `__post_init__`: `client_models` parses, and at most
  one of `client_models` and `client_models_file` is given.

  Raises:
    config.ConfigError: Naming the flags.
  """
  if settings.client_models and settings.client_models_file:
    raise config_lib.ConfigError(
        '--client_models and --client_models_file both give the clients\''
        ' architectures: give one of them.')
  if settings.client_models:
    parse_client_models(settings.client_models)


def load_client_models_file(path: str) -> collections.OrderedDict:
  """`--client_models_file`: OrderedDict(client id -> architecture).

  Raises:
    config.ConfigError: If the file is unreadable, not a non-empty JSON
      object, or names an architecture that is not a plain one.
  """
  try:
    with open(path) as f:
      mapping = json.load(f, object_pairs_hook=collections.OrderedDict)
  except (OSError, ValueError) as e:
    raise config_lib.ConfigError(
        f'--client_models_file={path}: cannot read it ({type(e).__name__}:'
        f' {e}); it must hold a JSON object {{client_id: architecture}}.'
    ) from e
  if not isinstance(mapping, dict) or not mapping:
    raise config_lib.ConfigError(
        f'--client_models_file={path} must hold a non-empty JSON object'
        ' {client_id: architecture}.')
  for cid, name in mapping.items():
    if name not in model_names.PLAIN_MODELS:
      raise config_lib.ConfigError(
          f'--client_models_file={path}: client {cid!r} has unknown'
          f' architecture {name!r}; use one of'
          f' {", ".join(model_names.PLAIN_MODELS)}.')
  return mapping


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


def architectures(config: config_lib.RunConfig) -> tuple[str, ...]:
  """The run's architectures: of `--client_models` or its file (in order
  of first appearance), else `--model`."""
  if config.settings.client_models_file:
    return tuple(dict.fromkeys(load_client_models_file(
        config.settings.client_models_file).values()))
  return tuple(architecture_shares(config))


def client_assignment(config: config_lib.RunConfig,
                      client_ids: Sequence[str]) -> dict[str, str]:
  """Client id -> its architecture: the file's, or `assign_architectures`
  of the shares."""
  if config.settings.client_models_file:
    mapping = load_client_models_file(config.settings.client_models_file)
    return {cid: mapping[cid] for cid in client_ids}
  return assign_architectures(list(client_ids), architecture_shares(config),
                              config.seed)


def architecture_shares(config: config_lib.RunConfig
                        ) -> collections.OrderedDict:
  """Architecture -> its share of the clients (`--model` alone if unset;
  not for a run with `--client_models_file`)."""
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
  (with `--client_models`) every architecture with at least one client.

  Raises:
    config.ConfigError: Naming the flags that disagree.
  """
  names = architectures(config)
  if main_model(config) not in names:
    given = (f'--client_models_file={config.settings.client_models_file}'
             if config.settings.client_models_file else
             f'--client_models={config.settings.client_models}')
    raise config_lib.ConfigError(
        f'--model={main_model(config)} is not one of {given}: set --model'
        f' to one of {", ".join(names)} (its model is the run\'s global'
        ' model).')
  if config.settings.client_models_file:
    return
  counts = client_counts(architecture_shares(config), config.num_clients)
  empty = [name for name, count in counts.items() if not count]
  if empty:
    raise config_lib.ConfigError(
        f'--client_models={config.settings.client_models} gives no client'
        f' of --num_clients={config.num_clients} to {", ".join(empty)}:'
        ' raise its share or the number of clients.')


def check_client_files(config: config_lib.RunConfig,
                       client_ids: Sequence[str]) -> None:
  """For `Recipe.check_client_files`: `--client_models_file` names every
  client of the run and no other.

  Raises:
    config.ConfigError: Naming the file and the clients.
  """
  path = config.settings.client_models_file
  if not path:
    return
  mapping = load_client_models_file(path)
  missing = [cid for cid in client_ids if cid not in mapping]
  if missing:
    raise config_lib.ConfigError(
        f'--client_models_file={path} gives no architecture to'
        f' {len(missing)} client(s), e.g. {", ".join(missing[:5])}; give'
        ' every client one.')
  known = set(client_ids)
  unknown = [str(cid) for cid in mapping if cid not in known]
  if unknown:
    raise config_lib.ConfigError(
        f'--client_models_file={path} names {len(unknown)} client(s) this'
        f' run does not have, e.g. {", ".join(unknown[:5])}; its clients'
        f' are {client_ids[0]} .. {client_ids[-1]}.')


def model_variants(config: config_lib.RunConfig) -> dict[str, str]:
  """For `Recipe.model_variants`: each architecture, as a variant of its
  own name."""
  return {name: name for name in architectures(config)}


class SeveralArchitectures:
  """A recipe whose clients train several architectures (mix in before
  `recipe.Recipe`): `--client_models_file` checked against the clients, a
  model variant per architecture, and once built `architectures` and
  `client_architectures` (client id -> its architecture)."""

  def __init__(self, context: Any):
    super().__init__(context)
    self.architectures = architectures(self.config)
    self.client_architectures = client_assignment(self.config,
                                                  context.client_ids)

  @classmethod
  def check_client_files(cls, config: config_lib.RunConfig,
                         client_ids: Sequence[str]) -> None:
    check_client_files(config, client_ids)

  @classmethod
  def model_variants(cls, config: config_lib.RunConfig) -> dict[str, str]:
    return model_variants(config)
