"""Ditto (Li et al. 2021): FedAvg's global model plus personal models.

Each round, before the global update, every sampled client trains its
personal model on F_k(v) + (lambda/2)||v - w^t||^2, anchored at the global
model w^t the round starts from (`tff_fair.algorithms.ditto`). Personal
models live in the run's `personal/` store, versioned with the checkpoints.

Outputs of its own: `personal/` (the models) and `personal_rounds.csv`
(each sampled client's personal step per round: the lambda, whether it was
chosen this round, and the loss and accuracy of the model it ends with on
its training and validation data, so a collapsed personal model shows).
Per round it releases `personal_*` statistics; its per-round evaluation
measures the personalized models (`test_*`) and the global one
(`global_test_*`); after the last round it reports 'personalized' (and
'personalized_or_global' when some clients never trained) and 'validated'
(each client's choice of its personal model or the global one on its
validation split: `personalization`).
"""

from collections.abc import Mapping, Sequence
import dataclasses
import math
from typing import Any, Optional

import numpy as np

from tff_fair.algorithms import ditto as ditto_lib
from tff_fair.runtime import remote
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import personalization
from tff_fair.training import reports
from tff_fair.training.recipes import own_models
from tff_fair.training.recipes import recipe

VARIANTS = ('sequential', 'interleaved')
PERSONAL_ITERATES = own_models.PERSONAL_ITERATES
PERSONAL_DIR = own_models.PERSONAL_DIR
ROUND_LOG = 'personal_rounds.csv'
ROUND_LOG_FIELDS = (
    'round', 'client', 'malicious', 'lambda', 'lambda_chosen',
    'train_loss_during', 'train_loss', 'train_accuracy', 'validation_loss',
    'validation_accuracy')
# The shuffle stream of the sequential variant's personal epochs (the global
# update's is 0).
PERSONAL_STREAM = 1


@dataclasses.dataclass
class _Round(recipe.Round):
  """A Ditto round, from `before_round` to `after_round`.

  Attributes (besides `recipe.Round`'s):
    due: Whether the client's lambda is chosen this round.
    anchor: w^t, where a client's first personal model starts.
    fused: Whether `run_round` trains the personal models too.
    records: The round's `personal_rounds.csv` rows, once trained.
    seconds: The personal phases' seconds (parts of `seconds_train`).
  """

  due: Mapping[str, bool] = dataclasses.field(default_factory=dict)
  anchor: Any = None
  fused: bool = False
  records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  seconds: dict[str, float] = dataclasses.field(default_factory=dict)


def check_lambda(name: str, value: Any) -> None:
  """Refuses a lambda that is not a finite number >= 0, naming its setting."""
  try:
    ditto_lib.check_lambda(value)
  except ValueError as e:
    raise config_lib.ConfigError(f'{name}: {e}') from e


@dataclasses.dataclass(frozen=True)
class Settings(own_models.PersonalTrainingSettings):
  """Attributes (besides the personal model's training,
  `own_models.PersonalTrainingSettings`, whose epochs the sequential
  variant reads):

    ditto_lambda: Lambda of every client (when neither ditto_lambda_grid
      nor ditto_lambdas_file is given).
    ditto_lambda_grid: Comma-separated lambdas; each client picks the one
      whose personal model has the lowest loss on its validation split (the
      Ditto paper's heuristic; candidates train from the client's current
      personal model), first when it first trains, then again every
      `ditto_lambda_every` rounds.
    ditto_lambda_every: With a grid: re-choose a client's lambda when its
      choice is at least this many rounds old (1: every round it trains,
      as the reference code's dynamic lambda); 0 chooses once.
    ditto_lambdas_file: JSON file {client_id: lambda} covering every client.
    ditto_variant: 'sequential' (personal epochs after the global ones, both
      from w^t) or 'interleaved' (one personal step per global step, on the
      same batches, as in the reference code; both models train in one
      pass over each client's data, `personalize_and_next`, except in a
      round choosing lambdas from a grid or on several workers).
    personal_iterate: The personal model a round keeps: 'average' (the
      mean of the round's iterates; stable) or 'last' (the last iterate, as
      the reference code; on skewed clients it can end a round collapsed
      onto one class).
  """

  ditto_lambda: float = config_lib.setting(
      1.0, 'lambda of every client.')
  ditto_lambda_grid: str = config_lib.setting(
      '', 'comma-separated lambdas; each client picks one by'
      ' validation loss (e.g. 0.1,1,2), again every --ditto_lambda_every'
      ' rounds.')
  ditto_lambda_every: int = config_lib.setting(
      1, "re-choose each client's lambda from the grid every N rounds"
      ' (0: once, at its first round).')
  ditto_lambdas_file: str = config_lib.setting(
      '', 'JSON file {client_id: lambda} for every client.')
  ditto_variant: str = config_lib.setting(
      'sequential', 'update schedule.', choices=VARIANTS)
  personal_iterate: str = own_models.personal_iterate_setting()

  def __post_init__(self):
    super().__post_init__()
    config_lib.check_choice('ditto_variant', self.ditto_variant, VARIANTS)
    config_lib.check_choice('personal_iterate', self.personal_iterate,
                            PERSONAL_ITERATES)
    if self.ditto_lambda_every < 0:
      raise config_lib.ConfigError(
          f'ditto_lambda_every must be >= 0, got {self.ditto_lambda_every}.')
    check_lambda('ditto_lambda', self.ditto_lambda)
    self.lambda_grid()  # Validates the grid.
    if self.ditto_lambda_grid and self.ditto_lambdas_file:
      raise config_lib.ConfigError(
          'Give either ditto_lambda_grid or ditto_lambdas_file, not both.')

  def lambda_grid(self) -> tuple[float, ...]:
    """The parsed `ditto_lambda_grid` (empty when not given)."""
    if not self.ditto_lambda_grid:
      return ()
    try:
      grid = tuple(float(v) for v in self.ditto_lambda_grid.split(','))
    except ValueError as e:
      raise config_lib.ConfigError(
          f'ditto_lambda_grid must be comma-separated numbers, got'
          f' {self.ditto_lambda_grid!r}.') from e
    for value in grid:
      check_lambda('ditto_lambda_grid', value)
    return grid


def load_lambdas(path: str, client_ids: Sequence[str]) -> dict[str, float]:
  """Per-client lambdas from a JSON file {client_id: lambda}.

  Raises:
    ConfigError: If the file is unreadable, a value is not a lambda, or a
      client is missing.
  """
  mapping = experiment_lib.load_client_values(path, client_ids, 'lambda')
  for cid in client_ids:
    check_lambda(f'{path}[{cid!r}]', mapping[cid])
  return mapping


def choose_lambda(validation_losses: Mapping[float, float]) -> float:
  """The lambda whose personal model has the lowest validation loss.

  Args:
    validation_losses: Candidate lambda -> validation loss of the personal
      model trained with it.

  Returns:
    The arg-min; a NaN loss (a diverged candidate) never wins, and ties go
    to the smaller lambda.
  """
  if not validation_losses:
    raise ValueError('choose_lambda needs at least one candidate.')
  return min(validation_losses, key=lambda lam: (
      math.inf if math.isnan(validation_losses[lam])
      else validation_losses[lam], lam))


class Ditto(own_models.OwnModels):
  """Ditto's global model (FedAvg) and personal models, one per client."""

  name = 'ditto'
  Settings = Settings
  output_files = (ROUND_LOG, personalization.CHOICE_FILE)
  client_state_dirs = (PERSONAL_DIR,)
  models_dir = PERSONAL_DIR
  progress_fields = own_models.PERSONAL_TRAIN_PROGRESS

  @classmethod
  def check_config(cls, config):
    settings = config.settings
    if settings.ditto_lambda_grid and config.validation_fraction == 0:
      raise config_lib.ConfigError(
          'ditto_lambda_grid chooses lambdas by validation loss, but'
          ' validation_fraction is 0; raise validation_fraction (e.g. 0.1)'
          ' or give one ditto_lambda.')
    return own_models.resolve_personal_rate(config)

  @classmethod
  def needed_splits(cls, config):
    if config.settings.lambda_grid():
      return ('train', 'test', 'validation')  # Each client picks on it.
    return ('train', 'test')

  @classmethod
  def check_client_files(cls, config, client_ids):
    if config.settings.ditto_lambdas_file:
      load_lambdas(config.settings.ditto_lambdas_file, client_ids)

  def __init__(self, context):
    super().__init__(context)
    settings = self.settings
    self._log = context.round_log(ROUND_LOG, ROUND_LOG_FIELDS)
    self._grid = settings.lambda_grid()
    self._lambdas: Mapping[str, float] = {}
    if settings.ditto_lambdas_file:
      self._lambdas = load_lambdas(settings.ditto_lambdas_file,
                                   context.client_ids)
    self._process: Optional[ditto_lib.DittoProcess] = None

  def final_evaluations(self, state, global_weights):
    evaluations = super().final_evaluations(state, global_weights)
    evaluations.update(self.validated_metrics(global_weights))
    return evaluations

  def build_process(self):
    settings = self.settings
    self._process = ditto_lib.build_ditto(
        self.model_fn, self.client_optimizer(), self.server_optimizer(),
        personal_optimizer_fn=settings.personal_optimizer_fn(),
        model_aggregator=self.model_aggregator(),
        average_personal_iterates=settings.personal_iterate == 'average',
        client_context=True)
    return self._process

  def lam(self, client_id: str) -> Optional[float]:
    """The client's lambda; None when it is still to be chosen."""
    if self._lambdas:
      return self._lambdas[client_id]
    if not self._grid:
      return self.settings.ditto_lambda
    metadata = self.own_models.metadata(client_id)
    return None if metadata is None else float(metadata['lam'])

  def _lambda_due(self, client_id: str, round_num: int) -> bool:
    """Whether the client's lambda is chosen from the grid this round.

    Its first round, then when the choice is `ditto_lambda_every` rounds
    old (never again with 0).
    """
    if not self._grid:
      return False
    metadata = self.own_models.metadata(client_id)
    if metadata is None:
      return True
    every = self.settings.ditto_lambda_every
    if every <= 0:
      return False
    # Stores written before lambdas were re-chosen lack the round: the
    # choice then dates from the client's first round, at the latest round 0.
    return round_num - int(metadata.get('lam_round', 0)) >= every

  def before_round(self, state, client_ids, round_num, datasets):
    """Ditto's personal step for the round's clients, anchored at w^t.

    A client seen for the first time starts from w^t, later from its own
    personal model. With a lambda grid, a client whose lambda is due trains
    one candidate per lambda from that same start and keeps the one with
    the lowest loss on its validation split (the reference code's
    `dynamic_lam`); the chosen lambda is stored with its model. An
    interleaved round with one candidate per client is left to `run_round`,
    which trains both models in one pass.

    The round's `personal_rounds.csv` records: the lambda, whether it was
    chosen this round, the mean training loss over the epoch's batches
    (`train_loss_during`) and the loss and accuracy of the model the round
    ends with on the client's training data (what it trained on, poisoned
    labels included) and on its validation split.
    """
    settings = self.settings
    context = self.context
    due = {cid: self._lambda_due(cid, round_num) for cid in client_ids}
    anchor = self._process.get_model_weights(state)
    # One candidate per client on the global update's batches: `run_round`
    # trains both models in one pass (`personalize_and_next`), which a
    # context splitting clients over workers cannot return.
    fused = (settings.ditto_variant == 'interleaved'
             and not any(due.values()) and not remote.is_multi_worker())
    plan = _Round(round_num, tuple(client_ids), state, due, anchor, fused)
    if fused:
      return plan
    if settings.ditto_variant == 'interleaved':
      personal_data = datasets  # The very batches of the global update.
    else:
      personal_data = context.client_datasets(
          client_ids, round_num, settings.personal_epochs,
          stream=PERSONAL_STREAM)
    jobs = []  # (client, lambda) per personalize input.
    inputs = []
    for cid, dataset in zip(client_ids, personal_data):
      start = self.own_models.weights(cid)
      for candidate in (self._grid if due[cid] else [self.lam(cid)]):
        jobs.append((cid, candidate))
        inputs.append(ditto_lib.personal_input(
            dataset, anchor if start is None else start, candidate))
    timer = reports.PhaseTimer()
    with timer.phase('personal_train'):
      outputs = dict(zip(jobs, remote.map_clients(
          self._process.personalize, state, inputs)))
    self._keep_personal(plan, outputs, timer)
    return plan

  def client_input(self, plan, client_id, dataset, attack):
    """`next`'s input, or `personalize_and_next`'s when the round fuses."""
    if not plan.fused:
      return super().client_input(plan, client_id, dataset, attack)
    start = self.own_models.weights(client_id)
    return ditto_lib.paired_input(
        dataset, plan.anchor if start is None else start,
        self.lam(client_id), client_context=True, attack=attack)

  def run_round(self, plan, process, state, client_inputs):
    """`next`, or both models in one pass when `before_round` deferred."""
    if not plan.fused:
      return super().run_round(plan, process, state, client_inputs)
    timer = reports.PhaseTimer()
    with timer.phase('personal_and_global_train'):
      output = process.personalize_and_next(state, client_inputs)
    self._keep_personal(
        plan, {(cid, self.lam(cid)): personal
               for cid, personal in zip(plan.client_ids, output.clients)},
        timer)
    return output

  def _keep_personal(self, plan: _Round, outputs,
                     timer: reports.PhaseTimer) -> None:
    """Chooses, checks and stores the round's personal models.

    Args:
      plan: The round (its records and seconds are filled here).
      outputs: (client, lambda) -> `personalize`'s output for it.
      timer: The round's personal phases so far.
    """
    round_num, client_ids, due = plan.number, plan.client_ids, plan.due
    context = self.context
    with timer.phase('personal_checks'):
      trained, chosen, on_split = self._choose_and_check(
          client_ids, list(outputs), due, outputs)
    with timer.phase('personal_write'):
      for cid in client_ids:
        metadata = self.own_models.metadata(cid)
        lam_round = (round_num if due[cid] or metadata is None
                     else int(metadata.get('lam_round', 0)))
        self.own_models.write(
            cid, trained[cid], round_num,
            {'lam': float(chosen[cid]), 'lam_round': lam_round})
        on_train, validation = on_split[(cid, 'train')], on_split.get(
            (cid, 'validation'))
        plan.records.append({
            'round': round_num,
            'client': cid,
            'malicious': int(cid in context.malicious),
            'lambda': chosen[cid],
            'lambda_chosen': int(due[cid]),
            'train_loss_during': float(outputs[(cid, chosen[cid])]['loss']),
            'train_loss': on_train.loss,
            'train_accuracy': on_train.accuracy,
            'validation_loss': '' if validation is None else validation.loss,
            'validation_accuracy': ('' if validation is None
                                    else validation.accuracy),
        })
    plan.seconds = timer.released()

  def _choose_and_check(self, client_ids, jobs, due, outputs):
    """Each client's chosen lambda and model, and its checks on its splits.

    Returns:
      (client -> trained personal weights, client -> lambda,
       (client, 'train' | 'validation') -> metrics of that model).
    """
    context = self.context
    data = context.experiment.data
    candidate_losses = {}
    chosen_jobs = [job for job in jobs if due[job[0]]]
    if chosen_jobs:
      # Every client has validation examples here (`needed_splits`).
      candidate_losses = {
          job: m.loss for job, m in context.evaluator.evaluate_clients(
              {job: outputs[job]['personal'] for job in chosen_jobs},
              chosen_jobs,
              lambda job: data.arrays(job[0], 'validation')).items()}
    chosen = {}
    for cid in client_ids:
      if due[cid]:
        chosen[cid] = choose_lambda({
            lam: loss for (c, lam), loss in candidate_losses.items()
            if c == cid})
      else:
        chosen[cid] = self.lam(cid)
    trained = {cid: outputs[(cid, chosen[cid])]['personal']
               for cid in client_ids}
    # One evaluation call (one model build and trace) for both splits.
    keys = [(cid, 'train') for cid in client_ids] + [
        (cid, 'validation') for cid in client_ids
        if data.num_examples(cid, 'validation')]
    on_split = context.evaluator.evaluate_clients(
        lambda key: trained[key[0]], keys,
        lambda key: (context.training_arrays(key[0]) if key[1] == 'train'
                     else data.arrays(*key)))
    return trained, chosen, on_split

  def after_round(self, plan, output):
    """Logs the round's personal steps; releases their statistics.

    Of the model each client ends the round with, on its training data, so
    a collapsed personal model shows (the loss averaged over the epoch's
    batches does not show it). Benign clients only when an attack is on.
    """
    del output  # The personal models were kept as they were trained.
    self._log.append(plan.records)
    benign = [r for r in plan.records if not r['malicious']]
    # Parts of the round's `seconds_train`.
    released = dict(plan.seconds)
    if not benign:  # Only attackers sampled: nothing to report this round.
      return released
    released.update(own_models.personal_train_statistics(benign))
    released['personal_lambda_mean'] = float(
        np.mean([r['lambda'] for r in benign]))
    return released
