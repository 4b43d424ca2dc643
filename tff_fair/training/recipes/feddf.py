"""FedDF (Lin et al. 2020): FedAvg per architecture, fused by distillation.

Clients of different architectures (`--client_models`, e.g.
`lenet:0.5,ditto_cnn:0.5`) each train their architecture's global model
by FedAvg; after the round the server distils the averaged logits of
every model it received, on the public set (`--public_examples`:
examples no client holds; their labels are never used), into each
architecture's model: KL divergence, Adam at `--feddf_learning_rate`,
keeping the step most accurate on the server's validation set
(`--server_held_out_examples`), checked every `--feddf_validate_every`
steps, for at most `--feddf_distillation_steps` steps and
`--feddf_patience` steps without improvement
(`tff_fair.algorithms.feddf`).

Which client holds which architecture: the shares of `--client_models`
in whole clients (largest remainders), over the clients in an order
shuffled by the run's seed, so it does not follow the partition's order;
or the JSON file `--client_models_file` gives each client its own
(`client_architectures`, shared with FedMD).
`--model` must be one of the architectures (its model is what the driver
calls the global model); an empty `--client_models` gives every client
`--model` (FedAvg plus the server's distillation).

Evaluation: 'global' is each client's test metrics with its
architecture's model after distillation; per round `test_*` measures the
same. Released each round: `ensemble_size`, `ensemble_validation_accuracy`
(the teacher's accuracy on the server's validation set) and, per
architecture A, `A_distillation_*` (steps, best step, validation accuracy
before and after, and `loss`: the KL divergence to the teacher over the
last `--feddf_validate_every` steps). `feddf_distillation.csv` has one
row per round and architecture: its sampled clients and its distillation.

The server state is each architecture's FedAvg state: checkpointed as it
is, so a resumed run continues with the same models. The distillation is
seeded by the teacher's logits, so it repeats exactly.
"""

import collections
import dataclasses
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import feddf as feddf_lib
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import client_architectures
from tff_fair.training.recipes import recipe

DISTILLATION_LOG = 'feddf_distillation.csv'
DISTILLATION_LOG_FIELDS = ('round', 'architecture', 'clients', 'steps',
                           'best_step', 'validation_accuracy_before',
                           'validation_accuracy', 'loss')


@dataclasses.dataclass(frozen=True)
class Settings:
  """Attributes (see the module docstring):

    client_models: 'architecture:share,...'; '' gives every client --model.
    client_models_file: JSON {client_id: architecture}, instead.
    feddf_distillation_steps: Most distillation steps per architecture and
      round (>= 0; 0: FedAvg per architecture).
    feddf_patience: Steps without a better validation accuracy that stop
      the distillation (>= 1).
    feddf_validate_every: Steps between validations (>= 1).
    feddf_batch_size: Public examples per distillation step (>= 1).
    feddf_learning_rate: Adam's learning rate in the distillation (> 0).
  """

  client_models: str = client_architectures.client_models_setting()
  client_models_file: str = client_architectures.client_models_file_setting()
  feddf_distillation_steps: int = config_lib.setting(
      500, 'most steps of server distillation per architecture and round'
      ' (0: FedAvg per architecture, no distillation).')
  feddf_patience: int = config_lib.setting(
      200, 'distillation stops after this many steps without a better'
      " accuracy on the server's validation set.")
  feddf_validate_every: int = config_lib.setting(
      50, "steps of distillation between measurements on the server's"
      ' validation set.')
  feddf_batch_size: int = config_lib.setting(
      64, 'public examples per distillation step.')
  feddf_learning_rate: float = config_lib.setting(
      1e-3, "Adam's learning rate in the server's distillation (the"
      " paper's 1e-3).")

  # The server's held-out sets may change when other runs resume (they are
  # read after training), not here: the validation set picks each
  # distilled model, and the public set is drawn beside them.
  fixed_on_resume: ClassVar[tuple[str, ...]] = ('server_held_out_examples',)

  def __post_init__(self):
    client_architectures.check_settings(self)
    for name, minimum in (('feddf_distillation_steps', 0),
                          ('feddf_patience', 1), ('feddf_validate_every', 1),
                          ('feddf_batch_size', 1)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or (
          value < minimum):
        raise config_lib.ConfigError(
            f'--{name} must be an int >= {minimum}, got {value!r}.')
    config_lib.check_learning_rate('--feddf_learning_rate',
                                   self.feddf_learning_rate)


class _Process:
  """`feddf.FedDFProcess` as the driver handles a process: the global model
  is `--model`'s; every architecture starts from its seeded weights."""

  def __init__(self, process: feddf_lib.FedDFProcess, main: str,
               initial_weights):
    self.feddf = process
    self._main = main
    self._initial_weights = initial_weights

  def initialize(self):
    return self.feddf.set_model_weights(self.feddf.initialize(),
                                        self._initial_weights)

  def get_model_weights(self, state):
    return self.feddf.processes[self._main].get_model_weights(
        state[self._main])

  def set_model_weights(self, state, weights):
    return self.feddf.set_model_weights(state, {self._main: weights})


class FedDF(client_architectures.SeveralArchitectures, recipe.Recipe):
  """FedDF: FedAvg per architecture, then the server's distillation."""

  name = 'feddf'
  Settings = Settings
  reads = {**config_lib.READS_ALL, 'aggregator': ('mean',),
           'server_held_out_examples': None, 'public_examples': None}
  ignored_because = {
      'aggregator': 'the server distils from every client\'s own model, as'
                    ' it received it: a robust, compressed or private'
                    ' aggregate of the updates would leave those models as'
                    ' they are (with the DP aggregator they would leak,'
                    ' unclipped and unnoised)',
  }
  runs_on_several_workers = False
  output_files = (DISTILLATION_LOG,)
  progress_fields = (('ensemble_validation_accuracy', 'teacher_val_acc'),)
  required_settings = {'public_examples': 200,
                       'server_held_out_examples': 100}

  @classmethod
  def check_config(cls, config):
    if not config.public_examples:
      raise config_lib.ConfigError(
          '--algorithm=feddf distils on a public set of examples no client'
          ' holds: set --public_examples=N (e.g. 200).')
    if not config.server_held_out_examples:
      raise config_lib.ConfigError(
          "--algorithm=feddf stops each distillation early on the server's"
          ' validation set: set --server_held_out_examples=N (e.g. 100).')
    client_architectures.check_client_models(config)
    return config

  def __init__(self, context):
    super().__init__(context)
    self._log = context.round_log(DISTILLATION_LOG, DISTILLATION_LOG_FIELDS)

  def build_process(self):
    settings = self.settings
    specs = self.context.experiment.model_specs
    data = self.context.experiment.data
    process = feddf_lib.build_feddf(
        {name: specs[name].model_fn for name in self.architectures},
        self.client_optimizer(), self.server_optimizer(),
        public_x=self.context.public_arrays()[0],
        validation=data.server_arrays('validation'),
        distillation_optimizer=tff.learning.optimizers.build_adam(
            learning_rate=settings.feddf_learning_rate),
        distillation_steps=settings.feddf_distillation_steps,
        validate_every=settings.feddf_validate_every,
        patience=settings.feddf_patience,
        distillation_batch_size=settings.feddf_batch_size,
        client_weighting=fed_avg.ClientWeighting.NUM_EXAMPLES,
        model_aggregator=self.model_aggregator(),
        client_context=True)
    self._feddf = process
    return _Process(process, client_architectures.main_model(self.config), {
        name: specs[name].initial_weights(self.config.seed)
        for name in self.architectures})

  def run_round(self, plan, process, state, client_inputs):
    by_architecture = collections.OrderedDict(
        (name, []) for name in self.architectures)
    for cid, client_input in zip(plan.client_ids, client_inputs):
      by_architecture[self.client_architectures[cid]].append(client_input)
    output = process.feddf.next(state, by_architecture)
    return client_outputs.RoundOutput(output.state, output.metrics, None)

  def after_round(self, plan, output):
    """Logs each architecture's clients and distillation."""
    sampled = collections.Counter(self.client_architectures[cid]
                                  for cid in plan.client_ids)
    self._log.append([{
        'round': plan.number, 'architecture': name,
        'clients': sampled[name],
        **{k: _scalar(v) for k, v in
           output.metrics[name]['distillation'].items()},
    } for name in self.architectures])
    return {}

  def _client_models(self, state):
    """Client id -> its architecture's model."""
    weights = self._feddf.get_model_weights(state)
    return lambda cid: weights[self.client_architectures[cid]]

  def evaluation_models(self, state, global_weights, client_ids):
    """Each client's architecture's model (`test_*`)."""
    del global_weights  # --model's model is one of the client models.
    return {'': (self._client_models(state), client_ids,
                 self.client_architectures)}, {}

  def final_evaluations(self, state, global_weights):
    """'global': each client with its architecture's model."""
    del global_weights  # One of them.
    return self.context.final_metrics(
        'global', self._client_models(state),
        variant=self.client_architectures)


def _scalar(value: Any) -> Any:
  value = np.asarray(value).item()
  return round(value, 6) if isinstance(value, float) else value
