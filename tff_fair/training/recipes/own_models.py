"""The base of algorithms whose every client keeps a model of its own.

Ditto's personal models, the models CGSV and IAFL reward each client with,
and FedRep's heads (a part of a model: `model_part`) live in one of the
run's `ClientModelStore`s (`models_dir`), versioned with the checkpoints.
A client's model is its entry joined to the global model
(`parts.ModelPart.compose`). Their evaluation is the same: per round, each
client that has a model of its own on it (`test_*`) and every client on the
global model (`global_test_*`); after the last round 'personalized' (the
clients with a model of their own) and, when some client never trained,
'personalized_or_global' (every client with the model it would use).
"""

from collections.abc import Mapping, Sequence
import dataclasses
import math
from typing import Any, ClassVar

from absl import logging

from tff_fair.algorithms import client_outputs
from tff_fair.evaluation import statistics
from tff_fair.models import parts
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import personalization
from tff_fair.training.recipes import recipe


@dataclasses.dataclass(frozen=True)
class PersonalTrainingSettings:
  """How a client trains its personal model (or part) each round.

  The settings personalization methods share, by one name each: a method
  whose clients train a personal model or part by epochs of their own
  (Ditto's personal model, FedRep's head) inherits them, so they mean one
  thing wherever they are read. A knob of one method alone carries its
  prefix (`ditto_lambda`, `fedrep_...`, `pfedme_...`, `per_fedavg_...`),
  as does one whose meaning or default differs from these (pFedMe's
  personal rate of its inner steps: `pfedme_personal_learning_rate`).

  Attributes:
    personal_epochs: Epochs per round of the personal model or part.
    personal_optimizer / personal_learning_rate: Its optimizer (a rate of
      0: the client learning rate, resolved by `resolve_personal_rate`).
  """

  personal_epochs: int = config_lib.setting(
      1, 'epochs per round of each client\'s personal model or part.')
  personal_optimizer: str = config_lib.setting(
      'sgd', 'optimizer of the personal model or part.',
      choices=config_lib.OPTIMIZERS)
  personal_learning_rate: float = config_lib.setting(
      0.0, 'learning rate of the personal model or part (0: the client'
      ' learning rate).')

  def __post_init__(self):
    config_lib.check_choice('personal_optimizer', self.personal_optimizer,
                            config_lib.OPTIMIZERS)
    if self.personal_epochs < 1:
      raise config_lib.ConfigError(
          f'personal_epochs must be >= 1, got {self.personal_epochs}.')
    if self.personal_learning_rate != 0:  # 0: the client learning rate.
      config_lib.check_learning_rate('personal_learning_rate',
                                     self.personal_learning_rate)

  def personal_optimizer_fn(self):
    """The personal optimizer (after `resolve_personal_rate`)."""
    return experiment_lib.build_optimizer(self.personal_optimizer,
                                          self.personal_learning_rate)


# Which personal model a round keeps (`personal_iterate_setting`).
PERSONAL_ITERATES = ('average', 'last')


def personal_iterate_setting() -> Any:
  """The `personal_iterate` field of a method's settings.

  One name for one meaning wherever a round's personal training ends on a
  model the method keeps: 'average' (the mean of the round's iterates;
  stable) or 'last' (the last iterate, as the reference codes; on skewed
  clients it can end a round collapsed onto one class). Check it with
  `config.check_choice('personal_iterate', value, PERSONAL_ITERATES)`.
  """
  return config_lib.setting(
      'average', "personal model kept each round: the average of the"
      " round's iterates, or the last one (reference).",
      choices=PERSONAL_ITERATES)


def resolve_personal_rate(
    config: config_lib.RunConfig) -> config_lib.RunConfig:
  """`config` with a personal rate of 0 replaced by the client rate.

  For `Recipe.check_config`: config.json then records the rate used.
  """
  settings = config.settings
  if settings.personal_learning_rate == 0:
    return dataclasses.replace(config, settings=dataclasses.replace(
        settings, personal_learning_rate=config.client_learning_rate))
  return config

# Where a recipe's per-client personal models are kept, under the run.
PERSONAL_DIR = 'personal'
# The round line's field of a recipe that releases `personal_train_statistics`.
PERSONAL_TRAIN_PROGRESS = (('personal_train_accuracy_min',
                            'personal_train_acc min'),)


def personal_train_statistics(
    records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """`personal_train_{loss,accuracy}_{mean,worst}` of a round's personal steps.

  Of the models the round's clients end it with, on their training data
  (`train_loss`, `train_accuracy` of each record): the mean and the worst
  client (highest loss, lowest accuracy), so one collapsed personal model
  shows. Pass the benign clients' records (at least one). A personal model
  that diverged (a non-finite loss; its accuracy is still defined) makes the
  loss statistics NaN, as in `per_client.summarize_clients`, rather than
  stopping the run.
  """
  released = {}
  for name, worst in (('train_loss', 'max'), ('train_accuracy', 'min')):
    values = [r[name] for r in records]
    if name == 'train_loss' and not all(map(math.isfinite, values)):
      stats = statistics.undefined(len(values))
    else:
      stats = statistics.summarize(values,
                                   higher_is_better=name != 'train_loss')
    released[f'personal_{name}_mean'] = stats.mean
    released[f'personal_{name}_{worst}'] = stats.worst
  return released


# The store of the models CGSV and IAFL reward their clients with.
REWARDED_MODELS_DIR = 'client_models'


class OwnModels(recipe.Recipe):
  """A recipe whose clients each keep a model in `own_models`.

  Class attributes:
    models_dir: The store's folder in the output directory (also list it in
      `client_state_dirs`).
    evaluates_global: Whether the global model is one a client could use,
      and so is measured (`global_test_*`, 'global',
      'personalized_or_global'); FedRep's is not (its head never trains).

  Attributes:
    own_models: The clients' models or parts of models
      (`client_models.ClientModelStore`).
  """

  models_dir: ClassVar[str] = ''
  evaluates_global: ClassVar[bool] = True

  def __init__(self, context):
    super().__init__(context)
    self.own_models = context.client_model_store(
        self.models_dir,
        context.experiment.model_spec.initial_weights(self.config.seed),
        self.model_part())

  def model_part(self) -> parts.ModelPart:
    """What each client keeps of its own (the whole model by default)."""
    return parts.WHOLE

  def own_model_or_global(self, client_id: str, global_weights):
    """The client's own entry; the global model's before it first trains."""
    entry = self.own_models.weights(client_id)
    return (self.own_models.part.extract(global_weights) if entry is None
            else entry)

  def evaluation_models(self, state, global_weights, client_ids):
    """The own models of the clients that have one (`test_*`), the global
    model of every client (`global_test_*`, if `evaluates_global`), and how
    many clients have no model of their own yet
    (`personal_clients_untrained`).
    """
    trained = set(self.own_models.trained_client_ids())
    personalized = [cid for cid in client_ids if cid in trained]
    models = ({'global_': (global_weights, client_ids)}
              if self.evaluates_global else {})
    if personalized:
      models[''] = (self.own_models.lookup(global_weights), personalized)
    return models, {'personal_clients_untrained': float(
        len(client_ids) - len(personalized))}

  def final_evaluations(self, state, global_weights):
    """'global', and 'personalized': the clients that have a model of their own.

    A client never sampled has none; it is not scored with the global
    model as if personalized. When there are such clients, the kind
    'personalized_or_global' also reports every client with the model it
    would use (its own, else the global one). Without `evaluates_global`,
    'personalized' alone.
    """
    evaluations = (super().final_evaluations(state, global_weights)
                   if self.evaluates_global else {})
    ids = self.context.client_ids
    trained = set(self.own_models.trained_client_ids())
    lookup = self.own_models.lookup(global_weights)
    evaluations.update(self.context.final_metrics(
        'personalized', lookup,
        client_ids=[cid for cid in ids if cid in trained]))
    untrained = [cid for cid in ids if cid not in trained]
    if untrained:
      logging.info(
          '%d of %d clients were never sampled and have no model of their'
          ' own; they are left out of "personalized"%s.',
          len(untrained), len(ids),
          ' and counted in "personalized_or_global" with the global model'
          if self.evaluates_global else '')
      if self.evaluates_global:
        evaluations.update(self.context.final_metrics(
            'personalized_or_global', lookup))
    return evaluations

  def validated_metrics(self, global_weights):
    """'validated': each client's choice of the global model and its own.

    For personalization methods (a reward is not for its client to
    decline): the better of the two on the client's validation split
    (`personalization`); a client never trained has only the global model.
    """
    return personalization.validated_metrics(self.context, [
        personalization.Candidate('global', global_weights),
        personalization.Candidate(
            'personalized', self.own_models.lookup(global_weights),
            self.own_models.trained_client_ids())])



@dataclasses.dataclass
class RewardRound(recipe.Round):
  """A `RewardedModels` round: the global model each new client starts from.
  """

  global_weights: Any


class RewardedModels(OwnModels):
  """A `client_outputs` process whose clients train and receive own models.

  CGSV and IAFL: each sampled client's input carries its own model (the
  global one the first time), `next_with_client_outputs` returns each
  client's new model (what it was rewarded with), and the recipe keeps it.
  A subclass builds the process (`build_rewarding_process`) and turns the
  round's per-client values into its round log and released statistics
  (`record_round`); it may add input fields per client (`extra_input`).
  """

  runs_on_several_workers = False

  def __init__(self, context):
    super().__init__(context)
    self._process = None

  def build_rewarding_process(self) -> client_outputs.ProcessWithClientOutputs:
    """The process, built with `client_context=True`."""
    raise NotImplementedError(
        f'{type(self).__name__}.build_rewarding_process')

  def build_process(self):
    self._process = self.build_rewarding_process()
    return self._process

  def extra_input(self, client_id: str) -> dict[str, Any]:
    """Further fields of a client's input (none by default)."""
    del client_id
    return {}

  def before_round(self, state, client_ids, round_num, datasets):
    del datasets  # Each client's input is built one by one.
    return RewardRound(round_num, tuple(client_ids), state,
                       self._process.get_model_weights(state))

  def client_input(self, plan, client_id, dataset, attack):
    return client_outputs.model_client_input(
        dataset, self.own_model_or_global(client_id, plan.global_weights),
        attack, **self.extra_input(client_id))

  def run_round(self, plan, process, state, client_inputs):
    del plan  # Every client's input carries what it needs.
    return process.next_with_client_outputs(state, client_inputs)

  def after_round(self, plan, output):
    """Keeps each client's new model; logs and releases the round."""
    values = dict(zip(plan.client_ids, output.clients))
    for cid, client in values.items():
      self.own_models.write(
          cid, client_outputs.as_model_weights(client['model']), plan.number)
    return self.record_round(plan.number, values)

  def record_round(self, round_num: int,
                   values: Mapping[str, Mapping[str, Any]]
                   ) -> dict[str, float]:
    """Logs the round's per-client values (client id -> the process's).

    Returns:
      Values to release with the round's metrics.
    """
    raise NotImplementedError(f'{type(self).__name__}.record_round')
