"""From a `RunConfig` to the pieces of a run: data, model, optimizers.

This is the wiring shared by the program binaries, the benchmarks and a
user's notebook; it holds no training logic.
"""

from collections.abc import Mapping, Sequence
import dataclasses
import json
import math
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair import data as data_lib
from tff_fair import errors
from tff_fair.models import model_fns
from tff_fair.models import names as model_names
from tff_fair.models import slimmable_models
from tff_fair.training import config as config_lib

# The architecture each data set uses unless --model says otherwise.
DEFAULT_MODELS = {name: defaults.model for name, defaults
                  in config_lib.DATASET_DEFAULTS.items()}
# Architectures that read token ids; the others read images (H, W, C).
TEXT_MODELS = frozenset({'text_cnn', 'char_lstm', 'slimmable_text_cnn'})
# Architectures whose targets are a sequence (one class per position).
SEQUENCE_MODELS = frozenset({'char_lstm'})


# The model variants every experiment has: the trained architecture, and
# the same without a width input (the same model unless slimmable).
TRAINED = 'trained'
PLAIN = 'plain'


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Attributes:

    config: The run's settings.
    data: The clients' data.
    model_specs: Model variant -> its architecture bound to the data:
      `TRAINED` (slimmable for an algorithm that trains slimmable models),
      `PLAIN` (the same without a width input: what models trained alone
      use, `RunContext.train_locally`), and any the algorithm asks for
      (`Recipe.model_variants`, e.g. each architecture of a federation of
      several).
  """

  config: config_lib.RunConfig
  data: 'data_lib.FederatedData'
  model_specs: Mapping[str, model_fns.ModelSpec]

  @property
  def model_spec(self) -> model_fns.ModelSpec:
    """The trained architecture (`model_specs[TRAINED]`)."""
    return self.model_specs[TRAINED]

  @property
  def plain_model_spec(self) -> model_fns.ModelSpec:
    """The trained architecture without a width input."""
    return self.model_specs[PLAIN]


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


def load_client_values(
    path: str, client_ids: Sequence[str], what: str,
    every_client: bool = True,
) -> dict[str, float]:
  """A JSON file {client_id: number} covering every client.

  Args:
    path: The file.
    client_ids: The run's clients.
    what: What the numbers are, for messages.
    every_client: False lets the file leave clients out (they are left out
      of the result too).

  Raises:
    ConfigError: If the file is unreadable, not such a mapping, misses a
      client (with `every_client`), names an unknown one or holds a value
      that is not a finite number.
  """
  try:
    with open(path) as f:
      mapping = json.load(f)
  except (OSError, ValueError) as e:
    raise config_lib.ConfigError(
        f'Cannot read {path} ({type(e).__name__}: {e}); it must hold a JSON'
        f' object {{client_id: {what}}}.') from e
  if not isinstance(mapping, dict):
    raise config_lib.ConfigError(
        f'{path} holds a JSON {type(mapping).__name__}; it must hold a JSON'
        f' object {{client_id: {what}}}.')
  missing = [cid for cid in client_ids if cid not in mapping]
  if missing and every_client:
    raise config_lib.ConfigError(
        f'{path} has no {what} for {len(missing)} client(s), e.g.'
        f' {", ".join(missing[:5])}; give every client a value.')
  known = set(client_ids)
  unknown = sorted(str(cid) for cid in mapping if cid not in known)
  if unknown:
    raise config_lib.ConfigError(
        f'{path} names {len(unknown)} client(s) this run does not have, e.g.'
        f' {", ".join(unknown[:5])}; its clients are {client_ids[0]} ..'
        f' {client_ids[-1]}.')
  given = [cid for cid in client_ids if cid in mapping]
  for cid in given:
    value = mapping[cid]
    if (isinstance(value, bool) or not isinstance(value, (int, float))
        or not math.isfinite(value)):
      raise config_lib.ConfigError(
          f'{path}: the {what} of {cid!r} is {value!r}, not a finite number.')
  return {cid: float(mapping[cid]) for cid in given}


def load_label_noise(path: str, client_ids: Sequence[str]
                     ) -> dict[str, float]:
  """`--label_noise_file`: {client_id: fraction of labels made random}.

  Clients it leaves out keep their labels; '' means none.

  Raises:
    ConfigError: As `load_client_values`, and for a fraction outside
      [0, 1].
  """
  if not path:
    return {}
  noise = load_client_values(path, client_ids, 'label noise fraction',
                             every_client=False)
  for cid, fraction in noise.items():
    if not 0.0 <= fraction <= 1.0:
      raise config_lib.ConfigError(
          f'{path}: the label noise fraction of {cid!r} is {fraction}; give'
          ' a fraction in [0, 1] (1: every label random, a free rider).')
  return noise


def model_spec_for(
    source: 'data_lib.Source', model_name: str = '', slimmable: bool = False
) -> model_fns.ModelSpec:
  """Binds an architecture (default: the data set's) to a source's shapes.

  With `slimmable=True` the slimmable version of the architecture, whose
  input carries a width (`tff_fair.models.slimmable`).

  Args:
    source: The data; its name picks the default architecture.
    model_name: One of `models.names.PLAIN_MODELS` (`SLIMMABLE_MODELS` with
      `slimmable`); required for a source of your own, which has no default.
    slimmable: Whether to build the slimmable version.

  Raises:
    ConfigError: If no name is given and the source has no default.
  """
  name = model_name or DEFAULT_MODELS.get(source.name)
  if name is None:
    names = (model_names.SLIMMABLE_MODELS if slimmable
             else model_names.PLAIN_MODELS)
    raise config_lib.ConfigError(
        f'No default model for data set {source.name!r}; pass model_name'
        f' (--model in programs.train), one of {", ".join(names)}.'
    )
  x_dtype = tf.int32 if source.x.dtype.kind in 'iu' else tf.float32
  plain_name = name.removeprefix('slimmable_')
  if slimmable:
    spec_name = f'slimmable_{plain_name}'
    if spec_name not in slimmable_models.MODEL_NAMES:
      raise config_lib.ConfigError(
          f'Model {name!r} has no slimmable version; a slimmable algorithm'
          ' needs one of'
          f' {", ".join(slimmable_models.MODEL_NAMES)}.')
  else:
    spec_name = (plain_name if plain_name in model_fns.MODEL_NAMES
                 else f'slimmable_{plain_name}')
  spec = model_fns.build_model_spec(
      spec_name,
      x_shape=source.x.shape[1:],
      x_dtype=x_dtype,
      y_shape=source.y.shape[1:],
      num_classes=source.num_classes,
      # Token vocabulary: SST-2 records it; for characters it is the classes.
      vocab_size=source.metadata.get('num_tokens') or source.num_classes,
  )
  if not slimmable and spec_name in slimmable_models.MODEL_NAMES:
    # Only a slimmable version exists (resnet18): at full width, without a
    # width input, it is the plain architecture.
    spec = dataclasses.replace(spec, input_spec=model_fns.batched_input_spec(
        source.x.shape[1:], x_dtype, source.y.shape[1:]))
  return spec


def _describe_inputs(source: 'data_lib.Source') -> str:
  kind = 'token ids' if source.x.dtype.kind in 'iu' else 'images'
  return (f'--dataset={source.name} ({kind} of shape'
          f' {tuple(source.x.shape[1:])})')


def check_model_fits(
    source: 'data_lib.Source', spec: model_fns.ModelSpec, name: str = '',
    fix: str = ' Choose another --model, or leave it empty for the default.',
) -> None:
  """Refuses an architecture that cannot read the data set's examples.

  Rules first (text models read token ids, image models images; only
  sequence models take sequence targets), then a forward pass and the loss
  on two examples, which catches any other mismatch (e.g. an input too small
  for the architecture's pooling) before anything is traced or written.

  Args:
    source: The data.
    spec: The architecture bound to it.
    name: Its name (default: the spec's, without 'slimmable_').
    fix: What the message tells the user to do.

  Raises:
    ConfigError: Naming --model and --dataset.
  """
  name = name or spec.name.removeprefix('slimmable_')
  is_text = source.x.dtype.kind in 'iu' and source.x.ndim == 2
  if name in TEXT_MODELS and not is_text:
    raise config_lib.ConfigError(
        f'--model={name} reads token ids (sst2, shakespeare), not'
        f' {_describe_inputs(source)}.{fix}')
  if name not in TEXT_MODELS and (is_text or source.x.ndim != 4):
    raise config_lib.ConfigError(
        f'--model={name} reads images (height, width, channels), not'
        f' {_describe_inputs(source)}.{fix}')
  if (name in SEQUENCE_MODELS) != (not source.has_class_labels):
    raise config_lib.ConfigError(
        f'--model={name} predicts '
        + ('a class per position' if name in SEQUENCE_MODELS else
           'one class per example') + f', but --dataset={source.name} has '
        + ('one class per example' if source.has_class_labels else
           'a target per position') + f'.{fix}')
  try:
    model = spec.build_keras(None)
    logits = model(tf.constant(source.x[:2]), training=False)
    model_fns.loss_fn(spec.masks_padding)(tf.constant(source.y[:2]), logits)
  except (ValueError, TypeError, tf.errors.OpError) as e:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    detail = next((line for line in lines if 'dimension' in line.lower()),
                  lines[0] if lines else '')
    raise config_lib.ConfigError(
        f'--model={name} cannot read {_describe_inputs(source)}: a'
        f' two-example forward pass fails ({type(e).__name__}:'
        f' {detail[:200]}).{fix}') from e


def check_splits(config: config_lib.RunConfig,
                 federated: 'data_lib.FederatedData',
                 needed_splits: Sequence[str] = ('train', 'test')) -> None:
  """Refuses clients whose splits cannot serve the run (e.g. no test data).

  Args:
    config: The run's settings.
    federated: The clients' data.
    needed_splits: The splits every client needs examples in (the
      algorithm's: `Recipe.needed_splits`).

  Raises:
    ConfigError: Naming the settings that leave a split empty.
  """
  for split in needed_splits:
    empty = [cid for cid in federated.client_ids
             if federated.num_examples(cid, split) == 0]
    if empty:
      smallest = min(len(np.concatenate([federated.indices(cid, s) for s in
                                         data_lib.SPLITS]))
                     for cid in federated.client_ids)
      raise config_lib.ConfigError(
          f'{len(empty)} client(s) (e.g. {empty[0]}) get no {split} examples'
          f' (the smallest client has {smallest} examples, with'
          f' --examples_per_client={config.examples_per_client},'
          f' --validation_fraction={config.validation_fraction},'
          f' --test_fraction={config.test_fraction}); raise'
          ' --examples_per_client or the fraction, or use fewer clients.')


def build_experiment(
    config: config_lib.RunConfig, max_examples: Optional[int] = None, *,
    slimmable: bool = False,
    needed_splits: Sequence[str] = ('train', 'test'),
    variants: Optional[Mapping[str, str]] = None,
) -> Experiment:
  """Loads and partitions the data and binds the model to it.

  The checks that need the data run here, before a run writes or trains
  anything: the partition and splits, and the model against the data (the
  driver then has the algorithm's recipe check the files its settings name).

  Args:
    config: The run's settings.
    max_examples: Load only a stratified subset of this many examples
      (`data.load_source`); None: `config.source_examples` (0: all).
    slimmable: Train the slimmable version of the architecture (the
      algorithm's: `Recipe.slimmable`).
    needed_splits: The splits every client needs examples in.
    variants: More model variants: name -> architecture (one of
      `models.names.PLAIN_MODELS`), each checked against the data
      (`Recipe.model_variants`).

  Raises:
    errors.UserError: (`ConfigError`, `DataError`) For any of these.
  """
  if max_examples is None:
    max_examples = config.source_examples or None
  source = data_lib.load_source(config.dataset, config.data_dir or None,
                                max_examples=max_examples)
  try:
    federated = data_lib.build_federated_data(
        source,
        partition=config.partition,
        num_clients=config.num_clients,
        seed=config.seed,
        validation_fraction=config.validation_fraction,
        test_fraction=config.test_fraction,
        examples_per_client=config.examples_per_client or None,
        server_held_out_examples=config.server_held_out_examples,
        public_examples=config.public_examples,
        rotated_client_fraction=config.rotated_client_fraction,
        **config.partition_params(),
    )
  except ValueError as e:  # PartitionError and the split checks.
    raise config_lib.ConfigError(
        f'--dataset={config.dataset} ({source.num_examples} examples,'
        f' {source.num_classes} classes) cannot be split as asked'
        f' (--partition={config.partition},'
        f' --num_clients={config.num_clients}): {e}') from e
  check_splits(config, federated, needed_splits)
  load_label_noise(config.label_noise_file, federated.client_ids)
  plain_name = config.model.removeprefix('slimmable_')
  try:
    model_spec = model_spec_for(source, config.model, slimmable=slimmable)
    plain_model_spec = model_spec_for(source, plain_name)
  except errors.UserError:
    raise
  except ValueError as e:
    raise config_lib.ConfigError(
        f'--model={config.model}: {e}') from e
  check_model_fits(source, plain_model_spec)
  specs = {TRAINED: model_spec, PLAIN: plain_model_spec}
  for variant, name in (variants or {}).items():
    try:
      specs[variant] = model_spec_for(source, name)
    except ValueError as e:
      raise config_lib.ConfigError(
          f'Model variant {variant!r} ({name}): {e}') from e
    check_model_fits(source, specs[variant], name,
                     fix=' Choose another architecture for it.')
  return Experiment(config, federated, specs)
