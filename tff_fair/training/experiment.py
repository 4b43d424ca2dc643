"""From a `RunConfig` to the pieces of a run: data, model, optimizers.

This is the wiring shared by the program binaries, the benchmarks and a
user's notebook; it holds no training logic.
"""

from collections.abc import Sequence
import dataclasses
import json
import math

import tensorflow as tf
import tensorflow_federated as tff

from tff_fair import data as data_lib
from tff_fair.models import model_fns
from tff_fair.models import slimmable_models
from tff_fair.training import config as config_lib

# The architecture each data set uses unless --model says otherwise.
DEFAULT_MODELS = {name: defaults.model for name, defaults
                  in config_lib.DATASET_DEFAULTS.items()}


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Attributes:

    config: The run's settings.
    data: The clients' data.
    model_spec: The trained architecture (slimmable for Aequa).
    plain_model_spec: The same architecture without a width input (what
      standalone training and contributions use).
  """

  config: config_lib.RunConfig
  data: 'data_lib.FederatedData'
  model_spec: model_fns.ModelSpec
  plain_model_spec: model_fns.ModelSpec


def build_optimizer(
    name: str, learning_rate: float
) -> tff.learning.optimizers.Optimizer:
  """A `tff.learning` optimizer by name ('sgdm' uses momentum 0.9)."""
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)
  if name == 'sgdm':
    return tff.learning.optimizers.build_sgdm(
        learning_rate=learning_rate, momentum=0.9
    )
  if name == 'adam':
    return tff.learning.optimizers.build_adam(learning_rate=learning_rate)
  if name == 'adamw':
    return tff.learning.optimizers.build_adamw(learning_rate=learning_rate)
  raise config_lib.ConfigError(
      f'Unknown optimizer {name!r}; choose one of'
      f' {", ".join(config_lib.OPTIMIZERS)}.'
  )


def build_aggregator(
    config: config_lib.RunConfig,
) -> tff.aggregators.AggregationFactory:
  """The aggregation factory of the global model's updates."""
  if config.aggregator == 'mean':
    return tff.aggregators.MeanFactory()
  if config.aggregator == 'robust':
    return tff.learning.robust_aggregator()
  if config.aggregator == 'dp':
    return tff.learning.dp_aggregator(
        noise_multiplier=config.dp_noise_multiplier,
        clients_per_round=config.clients_per_round)
  return tff.learning.compression_aggregator()


def load_lambdas(path: str, client_ids: Sequence[str]) -> dict[str, float]:
  """Per-client Ditto lambdas from a JSON file {client_id: lambda}.

  Raises:
    ConfigError: If the file is unreadable, a value is not a lambda, or a
      client is missing.
  """
  mapping = load_client_values(path, client_ids, 'lambda')
  for cid in client_ids:
    config_lib.check_lambda(f'{path}[{cid!r}]', mapping[cid])
  return mapping


def load_client_values(
    path: str, client_ids: Sequence[str], what: str
) -> dict[str, float]:
  """A JSON file {client_id: number} covering every client.

  Raises:
    ConfigError: If the file is unreadable, not such a mapping, misses a
      client or holds a value that is not a finite number.
  """
  try:
    with open(path) as f:
      mapping = json.load(f)
  except (OSError, ValueError) as e:
    raise config_lib.ConfigError(f'Cannot read {path}: {e}') from e
  if not isinstance(mapping, dict):
    raise config_lib.ConfigError(
        f'{path} must hold a JSON object {{client_id: {what}}}.')
  missing = [cid for cid in client_ids if cid not in mapping]
  if missing:
    raise config_lib.ConfigError(
        f'{path} has no {what} for {len(missing)} client(s), e.g.'
        f' {", ".join(missing[:5])}; give every client a value.')
  for cid in client_ids:
    value = mapping[cid]
    if not (isinstance(value, (int, float)) and math.isfinite(value)):
      raise config_lib.ConfigError(
          f'{path}: the {what} of {cid!r} is {value!r}, not a finite number.')
  return {cid: float(mapping[cid]) for cid in client_ids}


def model_spec_for(
    source: 'data_lib.Source', model_name: str = '', slimmable: bool = False
) -> model_fns.ModelSpec:
  """Binds an architecture (default: the data set's) to a source's shapes.

  With `slimmable=True` the slimmable version of the architecture, whose
  input carries a width (`tff_fair.models.slimmable`).
  """
  name = model_name or DEFAULT_MODELS.get(source.name)
  if name is None:
    raise config_lib.ConfigError(
        f'No default model for data set {source.name!r}; pass --model.'
    )
  x_dtype = tf.int32 if source.x.dtype.kind in 'iu' else tf.float32
  if slimmable:
    slim_name = f'slimmable_{name.removeprefix("slimmable_")}'
    if slim_name not in slimmable_models.MODEL_NAMES:
      raise config_lib.ConfigError(
          f'Model {name!r} has no slimmable version; Aequa needs one of'
          f' {", ".join(slimmable_models.MODEL_NAMES)}.')
    return slimmable_models.build_model_spec(
        slim_name, x_shape=source.x.shape[1:], x_dtype=x_dtype,
        y_shape=source.y.shape[1:], num_classes=source.num_classes,
        vocab_size=source.metadata.get('num_tokens') or source.num_classes)
  return model_fns.build_model_spec(
      name,
      x_shape=source.x.shape[1:],
      x_dtype=x_dtype,
      y_shape=source.y.shape[1:],
      num_classes=source.num_classes,
      # Token vocabulary: SST-2 records it; for characters it is the classes.
      vocab_size=source.metadata.get('num_tokens') or source.num_classes,
  )


def build_experiment(config: config_lib.RunConfig) -> Experiment:
  """Loads and partitions the data and binds the model to it."""
  source = data_lib.load_source(config.dataset, config.data_dir or None)
  federated = data_lib.build_federated_data(
      source,
      partition=config.partition,
      num_clients=config.num_clients,
      seed=config.seed,
      validation_fraction=config.validation_fraction,
      test_fraction=config.test_fraction,
      examples_per_client=config.examples_per_client or None,
      server_held_out_examples=config.server_held_out_examples,
      **config.partition_params(),
  )
  plain_name = config.model.removeprefix('slimmable_')
  return Experiment(
      config, federated,
      model_spec_for(source, config.model,
                     slimmable=config.algorithm == 'aequa'),
      model_spec_for(source, plain_name))
