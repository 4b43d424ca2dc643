"""From a `RunConfig` to the pieces of a run: data, model, optimizers.

This is the wiring shared by the program binaries, the benchmarks and a
user's notebook; it holds no training logic.
"""

import dataclasses

import tensorflow as tf
import tensorflow_federated as tff

from tff_fair import data as data_lib
from tff_fair.models import model_fns
from tff_fair.training import config as config_lib

# The architecture each data set uses unless --model says otherwise.
DEFAULT_MODELS = {
    'fashion_mnist': 'lenet',
    'mnist': 'lenet',
    'femnist': 'lenet',
    'digits': 'lenet',
    'cifar10': 'cifar_cnn',
    'sst2': 'text_cnn',
    'shakespeare': 'char_lstm',
}


@dataclasses.dataclass(frozen=True)
class Experiment:
  config: config_lib.RunConfig
  data: 'data_lib.FederatedData'
  model_spec: model_fns.ModelSpec


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


def model_spec_for(
    source: 'data_lib.Source', model_name: str = ''
) -> model_fns.ModelSpec:
  """Binds an architecture (default: the data set's) to a source's shapes."""
  name = model_name or DEFAULT_MODELS.get(source.name)
  if name is None:
    raise config_lib.ConfigError(
        f'No default model for data set {source.name!r}; pass --model.'
    )
  x_dtype = tf.int32 if source.x.dtype.kind in 'iu' else tf.float32
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
      **config.partition_params(),
  )
  return Experiment(config, federated, model_spec_for(source, config.model))
