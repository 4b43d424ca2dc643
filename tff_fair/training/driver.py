"""The round driver: sampling, rounds, checkpoints, releases, evaluation.

What a program binary and a notebook share. A run is a function of its
`RunConfig`: client sampling and data shuffling for round r are derived from
`(seed, r)` alone, never from the history of a random generator, so a run
resumed from the checkpoint of round r continues exactly as the uninterrupted
run would have.

Output directory layout:

    config.json            the run's settings (checked on resume)
    checkpoints/           tff.program.FileProgramStateManager, one per round
    personal/              Ditto's personal models (tff_fair.state), versioned
                           by round in step with the checkpoints (those of
                           every kept checkpoint's round)
    personal_rounds.csv    Ditto: each sampled client's personal step per
                           round (lambda, training loss and accuracy of the
                           model it ends with; see personal.RoundLog)
    metrics.csv            per-round release (tff.program.CSVFileReleaseManager)
    tensorboard/           the same values as TensorBoard scalars
    clients_final.csv      per-client test metrics after the last round
    summary.json           statistics over clients after the last round
"""

import asyncio
import collections
from collections.abc import Callable, Mapping, Sequence
import csv
import dataclasses
import json
import math
import os
import time
from typing import Any, Optional

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair import attacks
from tff_fair import files
from tff_fair.algorithms import aequa
from tff_fair.algorithms import ditto
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import per_client_training
from tff_fair.algorithms import update_attacks
from tff_fair.evaluation import per_client
from tff_fair.evaluation import statistics
from tff_fair.runtime import remote
from tff_fair.state import client_store
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import personal as personal_lib
from tff_fair.training import rewards as rewards_lib
from tff_fair.training import run_dir

ClientMetrics = per_client.ClientMetrics


@dataclasses.dataclass
class RunResult:
  """What a finished run produced.

  Attributes:
    rounds_completed: The last federated round in the checkpoint.
    resumed_from_round: The checkpoint round this invocation started from
      (0 for a fresh run).
    evaluations: Model kind ('global', 'fine_tuned', 'standalone') ->
      client id -> metrics on that client's test split.
    history: One dict of released values per round run in this invocation.
    malicious: The clients that attacked (empty without an attack).
  """

  rounds_completed: int
  resumed_from_round: int
  evaluations: dict[str, dict[str, ClientMetrics]]
  history: list[dict[str, float]]
  malicious: frozenset[str] = frozenset()


def sample_clients(
    client_ids: Sequence[str], clients_per_round: int, seed: int,
    round_num: int,
) -> list[str]:
  """Uniform sample without replacement, a pure function of (seed, round)."""
  rng = np.random.default_rng([seed, round_num])
  chosen = rng.choice(len(client_ids), size=clients_per_round, replace=False)
  return [client_ids[i] for i in sorted(chosen)]


def shuffle_seed(seed: int, round_num: int, client_index: int,
                 stream: int = 0) -> int:
  """The shuffle seed of one client's data in one round (and stream)."""
  return int(np.random.default_rng([seed, round_num, client_index, stream])
             .integers(0, 2**31 - 1))


def training_arrays(
    experiment: experiment_lib.Experiment, client_id: str,
    poisoned: frozenset[str], client_index: Mapping[str, int],
) -> tuple[np.ndarray, np.ndarray]:
  """A client's training split as it trains on it (attack A1's labels too)."""
  x, y = experiment.data.arrays(client_id, 'train')
  if client_id in poisoned:
    y = attacks.poison_labels(y, experiment.data.source.num_classes,
                              experiment.config.seed, client_index[client_id])
  return x, y


def client_datasets(
    experiment: experiment_lib.Experiment,
    client_ids: Sequence[str],
    round_num: int,
    epochs: int,
    *,
    stream: int = 0,
    poisoned: frozenset[str] = frozenset(),
    client_index: Optional[Mapping[str, int]] = None,
) -> list[tf.data.Dataset]:
  """Shuffled, repeated, batched training data for `client_ids`.

  Args:
    experiment: The run.
    client_ids: Clients to serve, in order.
    round_num: Seeds the shuffle together with the run's seed.
    epochs: Passes over each client's training split.
    stream: Separates independent shuffles of the same round (e.g. Ditto's
      personal epochs in the sequential variant).
    poisoned: Clients whose labels are replaced by random ones (attack A1).
    client_index: Client id -> position in `experiment.data.client_ids`
      (seeds shuffles); pass it to avoid rebuilding it every round.

  Returns:
    One `tf.data.Dataset` per client.
  """
  config = experiment.config
  data = experiment.data
  index = client_index or {cid: i for i, cid in enumerate(data.client_ids)}
  datasets = []
  for cid in client_ids:
    x, y = training_arrays(experiment, cid, poisoned, index)
    ds = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).shuffle(
            len(y), seed=shuffle_seed(config.seed, round_num, index[cid],
                                      stream),
            reshuffle_each_iteration=True)
    datasets.append(ds.repeat(epochs).batch(config.batch_size))
  return datasets


def build_process(
    experiment: experiment_lib.Experiment,
) -> tff.learning.templates.LearningProcess:
  """The federated process of a run: FedAvg (attack-capable), Ditto, Aequa."""
  config = experiment.config
  optimizer = experiment_lib.build_optimizer
  client_optimizer = optimizer(config.client_optimizer,
                               config.client_learning_rate)
  server_optimizer = optimizer(config.server_optimizer,
                               config.server_learning_rate)
  aggregator = experiment_lib.build_aggregator(config)
  # The driver feeds every client an attack spec whose seed it chooses per
  # client and round (`fed_avg.client_input`): it opts in to client context.
  if config.algorithm == 'aequa':
    return aequa.build_aequa(
        experiment.model_spec.model_fn, client_optimizer, server_optimizer,
        model_aggregator=aggregator, p_min=config.p_min, p_max=config.p_max,
        widths_per_step=config.widths_per_step, client_context=True)
  if config.algorithm == 'ditto':
    return ditto.build_ditto(
        experiment.model_spec.model_fn, client_optimizer, server_optimizer,
        personal_optimizer_fn=optimizer(config.personal_optimizer,
                                        config.personal_learning_rate),
        model_aggregator=aggregator,
        average_personal_iterates=config.personal_iterate == 'average',
        client_context=True)
  return fed_avg.build_fed_avg(experiment.model_spec.model_fn,
                               client_optimizer, server_optimizer,
                               model_aggregator=aggregator,
                               client_context=True)


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


def _flatten(metrics: Any, prefix: str = '') -> dict[str, float]:
  flat = {}
  for key, value in metrics.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      flat.update(_flatten(value, name + '/'))
    elif np.ndim(value) == 0:
      flat[name] = float(value)
  return flat


def _format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f'{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'


class Trainer:
  """Runs, checkpoints and evaluates one configured experiment.

  Attributes:
    experiment: Data, model and configuration.
    process: The `LearningProcess` that trains the global model (a
      `DittoProcess` for Ditto).
    malicious: The clients that attack (empty without an attack).
  """

  def __init__(self, experiment: experiment_lib.Experiment):
    self.experiment = experiment
    self.config = config = experiment.config
    self.process = build_process(experiment)
    self._evaluator = per_client.ClientEvaluator(
        experiment.model_spec.build_keras)
    self._plain_evaluator = per_client.ClientEvaluator(
        experiment.plain_model_spec.build_keras)
    client_ids = experiment.data.client_ids
    attack = attacks.AttackConfig(
        kind=config.attack, malicious_fraction=config.malicious_fraction,
        scale=config.attack_scale, seed=config.seed)
    self.malicious = attacks.choose_malicious(client_ids, attack)
    self._poisoned = (self.malicious if config.attack ==
                      attacks.LABEL_POISONING else frozenset())
    self._client_index = {cid: i for i, cid in enumerate(client_ids)}
    out = config.output_dir
    self._personal = None
    if config.algorithm == 'ditto':
      if config.ditto_lambdas_file:
        lambdas = experiment_lib.load_lambdas(config.ditto_lambdas_file,
                                              client_ids)
      else:
        lambdas = config.lambda_grid() or config.ditto_lambda
      self._personal = personal_lib.PersonalModelStore(
          os.path.join(out, run_dir.PERSONAL),
          experiment.model_spec.initial_weights(config.seed), lambdas)
      self._personal_log = personal_lib.RoundLog(
          os.path.join(out, 'personal_rounds.csv'))
    # Created when the run starts: both create files and folders.
    self._state_manager = None
    self._csv_release = None
    self._tensorboard = None

  def _initial_state(self):
    state = self.process.initialize()
    return self.process.set_model_weights(
        state, self.experiment.model_spec.initial_weights(self.config.seed))

  def _restore(self, checkpoint_fallback: bool = False):
    """(state, round) from the latest checkpoint, or a fresh round-0 state.

    A damaged latest checkpoint stops the run with its path, or with
    `checkpoint_fallback` gives way to the newest intact one; for Ditto that
    round's personal models are opened with it (`run_dir.load_checkpoint`
    refuses a round whose personal models are gone).
    """
    out = self.config.output_dir
    initial = self._initial_state()
    self._state_manager = tff.program.FileProgramStateManager(
        run_dir.checkpoint_dir(out), keep_total=3, keep_first=True)

    personal_versions = set(client_store.committed_versions(
        os.path.join(out, run_dir.PERSONAL)))

    def personal_kept(version: int):
      if (self._personal is None or not version
          or version in personal_versions):
        return None
      # Run directories of tff_fair before the store kept several rounds
      # hold the latest round's personal models only.
      return ('its personal models were not kept: this run directory was'
              ' written by an older tff_fair that kept only the latest'
              " round's")

    state, version = run_dir.load_checkpoint(
        out, run_dir.checkpoint_versions(out),
        lambda v: asyncio.run(self._state_manager.load(v, initial)),
        fallback=checkpoint_fallback, usable=personal_kept)
    if state is None:
      asyncio.run(self._state_manager.save(initial, 0))
      state, version = initial, 0
    if self._personal is not None:
      self._personal.open(version)
      self._personal_log.open(version)
    return state, version

  def evaluate(
      self, weights: per_client.WeightsSource, split: str = 'test',
      plain: bool = False, client_ids: Optional[Sequence[str]] = None,
  ) -> dict[str, ClientMetrics]:
    """Per-client metrics of global or per-client `weights` on `split`.

    `plain=True` evaluates weights of the architecture without a width
    input (local training's models). `client_ids` defaults to every client.
    """
    data = self.experiment.data
    evaluator = self._plain_evaluator if plain else self._evaluator
    return evaluator.evaluate_clients(
        weights, data.client_ids if client_ids is None else client_ids,
        lambda cid: data.arrays(cid, split))

  def _train_locally(self, initial_weights, epochs: int, tag: int):
    """Per-client models trained from `initial_weights` (one per client).

    Logs the epochs. Uses the plain architecture (for Aequa: the full-width model without
    a width input; its weights have the same layout).
    """
    config = self.config
    logging.info('Training every client alone for %d epoch(s).', epochs)
    computation = per_client_training.build_per_client_training(
        self.experiment.plain_model_spec.model_fn,
        experiment_lib.build_optimizer(
            config.client_optimizer, config.client_learning_rate),
        epochs,
    )
    client_ids = self.experiment.data.client_ids
    trained = {}
    # Groups of clients_per_round bound the memory of one call.
    step = config.clients_per_round
    for start in range(0, len(client_ids), step):
      group = client_ids[start:start + step]
      datasets = client_datasets(self.experiment, group, tag, epochs=1,
                                 poisoned=self._poisoned,
                                 client_index=self._client_index)
      trained.update(zip(group, remote.map_clients(computation, initial_weights,
                                                    datasets)))
    return trained

  def run(self, checkpoint_fallback: bool = False) -> RunResult:
    """Trains to `config.rounds`, resuming from the latest checkpoint.

    Args:
      checkpoint_fallback: Resume from the newest intact checkpoint when the
        latest is damaged (see `_restore`).
    """
    config = self.config
    state, start_round = self._restore(checkpoint_fallback)
    if start_round > config.rounds:
      raise config_lib.ConfigError(
          f'{config.output_dir} holds a checkpoint of round {start_round},'
          f' past rounds={config.rounds}; ask for at least {start_round}'
          ' rounds, or use a new --output_dir.')
    # The run goes on: config.json records this invocation's settings (more
    # --rounds, another width_step or solver; only settings that may change
    # on resumption can differ by now), so it describes the outputs beside it.
    config_lib.save_if_new(config, replace=True)
    if start_round >= config.rounds and config.algorithm != 'standalone':
      logging.info(
          'The checkpoint of round %d in %s ends the run; re-evaluating'
          ' only.', start_round, config.output_dir)
    elif start_round:
      logging.info(
          'Resuming from the checkpoint of round %d in %s; continuing at'
          ' round %d of %d.', start_round, config.output_dir,
          start_round + 1, config.rounds)
    history = []
    evaluations = {}
    if config.algorithm != 'standalone':
      state, history = self._run_rounds(state, start_round)
    global_weights = self.process.get_model_weights(state)
    if config.algorithm != 'standalone':
      evaluations['global'] = self.evaluate(global_weights)
    if config.algorithm == 'fedavg_ft':
      logging.info('Fine-tuning the global model on every client for %d'
                   ' epoch(s).', config.finetune_epochs)
      evaluations['fine_tuned'] = self.evaluate(self._train_locally(
          global_weights, config.finetune_epochs, tag=config.rounds + 1),
                                                plain=True)
    elif config.algorithm == 'standalone':
      evaluations['standalone'] = self._standalone(global_weights)
    elif config.algorithm == 'aequa':
      evaluations.update(self._aequa_rewards(global_weights))
    elif config.algorithm == 'ditto':
      evaluations.update(self._personalized_evaluations(global_weights))
    self._write_final(evaluations)
    return RunResult(
        rounds_completed=(0 if config.algorithm == 'standalone'
                          else config.rounds),
        resumed_from_round=start_round,
        evaluations=evaluations,
        history=history,
        malicious=self.malicious,
    )

  def _personalized_evaluations(
      self, global_weights) -> dict[str, dict[str, ClientMetrics]]:
    """'personalized': the clients that have a personal model.

    A client never sampled has none; it is not scored with the global
    model as if personalized. When there are such clients, the kind
    'personalized_or_global' also reports every client with the model it
    would use (its personal model, else the global one).
    """
    ids = self.experiment.data.client_ids
    trained = set(self._personal.trained_client_ids())
    lookup = self._personal.lookup(global_weights)
    evaluations = {'personalized': self.evaluate(
        lookup, client_ids=[cid for cid in ids if cid in trained])}
    untrained = [cid for cid in ids if cid not in trained]
    if untrained:
      logging.info(
          '%d of %d clients were never sampled and have no personal model;'
          ' they are left out of "personalized" and counted in'
          ' "personalized_or_global" with the global model.',
          len(untrained), len(ids))
      evaluations['personalized_or_global'] = self.evaluate(lookup)
    return evaluations

  def _standalone(self, initial_weights) -> dict[str, ClientMetrics]:
    epochs = self.standalone_epochs()
    return self.evaluate(self._train_locally(initial_weights, epochs, tag=0),
                         plain=True)

  def _pooled(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Every client's `split` examples, concatenated."""
    data = self.experiment.data
    arrays = [data.arrays(cid, split) for cid in data.client_ids]
    return (np.concatenate([x for x, _ in arrays]),
            np.concatenate([y for _, y in arrays]))

  def _aequa_rewards(self, global_weights) -> dict[str, dict[str,
                                                              ClientMetrics]]:
    """Contributions, width allocation and the rewarded models' metrics.

    Contributions and the width-accuracy curve are measured on the same
    common held-out set, so gains a_i - c_i compare like with like: a skewed
    client's standalone model is judged on the federation's distribution, as
    the global model is. With server held-out sets
    (`server_held_out_examples`) that is the server's validation set and the
    rewarded models are measured on the server's test set. Without them it
    is all clients' validation splits pooled (their test splits when there
    is none), and the rewarded models are measured on the pooled test
    splits. Each rewarded model is also measured on its client's own test
    split.
    """
    config = self.config
    data = self.experiment.data
    evaluations = {}
    if data.has_server_held_out:
      held_out = data.server_arrays('validation')
      reward_test = data.server_arrays('test')
    else:
      has_validation = any(data.num_examples(c, 'validation')
                           for c in data.client_ids)
      held_out = self._pooled('validation' if has_validation else 'test')
      reward_test = self._pooled('test')
    if config.contributions_file:
      contributions = experiment_lib.load_client_values(
          config.contributions_file, data.client_ids, 'contribution')
    else:
      logging.info('Measuring contributions as standalone accuracy on the'
                   ' common held-out data (%d examples).', len(held_out[1]))
      models = self._train_locally(
          self.experiment.plain_model_spec.initial_weights(config.seed),
          self.standalone_epochs(), tag=0)
      evaluations['standalone'] = self.evaluate(models, plain=True)
      on_held_out = self._plain_evaluator.evaluate_clients(
          models, data.client_ids, lambda _: held_out)
      contributions = {cid: m.accuracy for cid, m in on_held_out.items()}
    rewards = rewards_lib.assign_rewards(
        self.experiment.model_spec.build_keras, global_weights,
        config.width_grid(), held_out, contributions,
        lambda cid: data.arrays(cid, 'test'), reward_test,
        solver=config.allocation_solver,
        annealing_iterations=config.annealing_iterations, seed=config.seed)
    rewards_lib.write_tables(rewards, config.output_dir)
    rewards_lib.write_tensorboard(
        rewards, os.path.join(config.output_dir, 'tensorboard', 'aequa'))
    evaluations['aequa'] = dict(rewards.metrics)
    return evaluations

  def standalone_epochs(self) -> int:
    """The local epochs a client gets in federated training, in expectation.

    A client takes part in clients_per_round / num_clients of the rounds and
    trains local_epochs each time; standalone training gets the same budget.
    """
    c = self.config
    return max(1, round(c.rounds * c.local_epochs * c.clients_per_round /
                        c.num_clients))

  def _personalize(self, state, sampled: Sequence[str], round_num: int,
                   global_datasets: Sequence[tf.data.Dataset]
                   ) -> list[dict[str, Any]]:
    """Ditto's personal step for the round's clients, anchored at w^t.

    A client seen for the first time starts from w^t, later from its own
    personal model. With a lambda grid, a client whose lambda is due
    (`lambda_due`: its first round, then every `ditto_lambda_every` rounds)
    trains one candidate per lambda from that same start and keeps the one
    with the lowest loss on its validation split (the reference code's
    `dynamic_lam`); the chosen lambda is stored with its model.

    Returns:
      One record per sampled client for `personal_rounds.csv`: the lambda,
      whether it was chosen this round, the mean training loss over the
      epoch's batches (`train_loss_during`) and the loss and accuracy of the
      model the round ends with on the client's training data (what it
      trained on, poisoned labels included) and on its validation split.
    """
    config = self.config
    if config.ditto_variant == 'interleaved':
      datasets = global_datasets  # The very batches of the global update.
    else:
      datasets = client_datasets(self.experiment, sampled, round_num,
                                 config.personal_epochs, stream=1,
                                 poisoned=self._poisoned,
                                 client_index=self._client_index)
    anchor = self.process.get_model_weights(state)
    jobs = []  # (client, lambda) per personalize input.
    inputs = []
    due = {cid: self._personal.lambda_due(cid, round_num,
                                          config.ditto_lambda_every)
           for cid in sampled}
    for cid, dataset in zip(sampled, datasets):
      start = self._personal.weights(cid)
      candidates = (self._personal.lambda_grid if due[cid]
                    else [self._personal.lam(cid)])
      for candidate in candidates:
        jobs.append((cid, candidate))
        inputs.append(ditto.personal_input(
            dataset, anchor if start is None else start, candidate))
    outputs = dict(zip(jobs, remote.map_clients(self.process.personalize,
                                                state, inputs)))
    data = self.experiment.data
    candidate_losses = {}
    chosen_jobs = [job for job in jobs if due[job[0]]]
    if chosen_jobs:
      # Every client has validation examples here: with a grid,
      # experiment.check_splits refuses a run where one has none.
      candidate_losses = {
          job: m.loss for job, m in self._evaluator.evaluate_clients(
              {job: outputs[job]['personal'] for job in chosen_jobs},
              chosen_jobs,
              lambda job: data.arrays(job[0], 'validation')).items()}
    chosen = {}
    for cid in sampled:
      if due[cid]:
        chosen[cid] = choose_lambda({
            lam: loss for (c, lam), loss in candidate_losses.items()
            if c == cid})
      else:
        chosen[cid] = self._personal.lam(cid)
    trained = {cid: outputs[(cid, chosen[cid])]['personal']
               for cid in sampled}
    # One evaluation call (one model build and trace) for both splits.
    keys = [(cid, 'train') for cid in sampled] + [
        (cid, 'validation') for cid in sampled
        if data.num_examples(cid, 'validation')]
    on_split = self._evaluator.evaluate_clients(
        lambda key: trained[key[0]], keys,
        lambda key: (training_arrays(self.experiment, key[0], self._poisoned,
                                     self._client_index)
                     if key[1] == 'train' else data.arrays(*key)))
    records = []
    for cid in sampled:
      self._personal.write(cid, trained[cid], round_num, chosen[cid],
                           lam_round=round_num if due[cid] else None)
      on_train, validation = on_split[(cid, 'train')], on_split.get(
          (cid, 'validation'))
      records.append({
          'round': round_num,
          'client': cid,
          'malicious': int(cid in self.malicious),
          'lambda': chosen[cid],
          'lambda_chosen': int(due[cid]),
          'train_loss_during': float(outputs[(cid, chosen[cid])]['loss']),
          'train_loss': on_train.loss,
          'train_accuracy': on_train.accuracy,
          'validation_loss': '' if validation is None else validation.loss,
          'validation_accuracy': ('' if validation is None
                                  else validation.accuracy),
      })
    return records

  def _run_rounds(self, state, start_round: int):
    config = self.config
    if self._csv_release is None:
      out = config.output_dir
      self._csv_release = tff.program.CSVFileReleaseManager(
          os.path.join(out, 'metrics.csv'), key_fieldname='round')
      self._tensorboard = tff.program.TensorBoardReleaseManager(
          os.path.join(out, 'tensorboard'))
    history = []
    started = time.monotonic()
    for round_num in range(start_round + 1, config.rounds + 1):
      round_start = time.monotonic()
      sampled = sample_clients(self.experiment.data.client_ids,
                               config.clients_per_round, config.seed,
                               round_num)
      datasets = client_datasets(self.experiment, sampled, round_num,
                                 config.local_epochs,
                                 poisoned=self._poisoned,
                                 client_index=self._client_index)
      personal_records = []
      if self._personal is not None:
        # Anchored at w^t: `personalize` reads the state before `next`.
        personal_records = self._personalize(state, sampled, round_num,
                                             datasets)
      output = self.process.next(state, [
          fed_avg.client_input(ds, self._client_spec(cid, round_num))
          for cid, ds in zip(sampled, datasets)])
      state = output.state
      released = {
          k.replace('client_work/train/', 'train_'): v
          for k, v in _flatten(output.metrics).items()
          if k.startswith('client_work/train/')
      }
      if personal_records:
        released.update(self._personal_round_statistics(personal_records))
      # Client state, then the checkpoint, then pruning: a kill between any
      # two leaves a consistent pair (see tff_fair.state.client_store).
      if self._personal is not None:
        self._personal.commit(round_num)
        # Rows of a round without a checkpoint are dropped on resume.
        self._personal_log.append(personal_records)
      # After the commit: the round's personal models are the current ones.
      per_client_values = {}
      if config.eval_every and round_num % config.eval_every == 0:
        over_clients, per_client_values = self._round_evaluation(state)
        released.update(over_clients)
      released['seconds'] = time.monotonic() - round_start
      # Released before the checkpoint: a kill after the checkpoint would
      # otherwise lose the round's row for good (a resume starts after it),
      # while a round released without its checkpoint runs again and its
      # release replaces the old one (the CSV manager drops rows >= key;
      # TensorBoard purges steps it sees again).
      asyncio.run(self._csv_release.release(released, key=round_num))
      # Arrays become TensorBoard histograms: fairness as a distribution.
      asyncio.run(self._tensorboard.release(
          {**released, **per_client_values}, key=round_num))
      asyncio.run(self._state_manager.save(state, round_num))
      if self._personal is not None:
        # The saved checkpoints' rounds (the manager has pruned its own).
        self._personal.prune(
            round_num, keep=run_dir.checkpoint_versions(config.output_dir))
      history.append(released)
      done = round_num - start_round
      eta = (time.monotonic() - started) / done * (config.rounds - round_num)
      test = (f'  test_acc={released["test_accuracy_mean"]:.4f}'
              if 'test_accuracy_mean' in released else '')
      personal = ('  personal_train_acc min='
                  f'{released["personal_train_accuracy_min"]:.4f}'
                  if 'personal_train_accuracy_min' in released else '')
      logging.info(
          'round %d/%d  loss=%.4f  acc=%.4f%s%s  %.1f s/round  ETA %s',
          round_num, config.rounds, released.get('train_loss', math.nan),
          released.get('train_accuracy', math.nan), test, personal,
          released['seconds'], _format_duration(eta))
    return state, history

  def _personal_round_statistics(
      self, records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Released per round: the sampled clients' personal training metrics.

    Of the model each client ends the round with, on its training data, so
    a collapsed personal model shows (the loss averaged over the epoch's
    batches does not show it). Benign clients only when an attack is on.
    """
    benign = [r for r in records if not r['malicious']]
    released = {}
    if not benign:  # Only attackers sampled: nothing to report this round.
      return released
    for name, worst in (('train_loss', 'max'), ('train_accuracy', 'min')):
      stats = statistics.summarize(
          [r[name] for r in benign], higher_is_better=name != 'train_loss')
      released[f'personal_{name}_mean'] = stats.mean
      released[f'personal_{name}_{worst}'] = stats.worst
    released['personal_lambda_mean'] = float(
        np.mean([r['lambda'] for r in benign]))
    return released

  def _client_spec(self, client_id: str, round_num: int):
    """A client's attack and seed input for one round."""
    kind = (self.config.attack if client_id in self.malicious
            else attacks.NONE)
    return update_attacks.attack_spec(
        kind, self.config.attack_scale,
        seed=shuffle_seed(self.config.seed, round_num, 0, stream=2),
        client_index=self._client_index[client_id])

  def _round_evaluation(
      self, state) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Test statistics of the model(s) a client would use now.

    For Ditto: the personalized models (`test_*`) of the clients that have
    one, the global model (`global_test_*`) of every client, and how many
    clients have no personal model yet (`personal_clients_untrained`).
    Benign clients only when an attack is on, as the Ditto paper reports.

    Returns:
      (statistics over clients, per-client test accuracies as arrays named
      `[global_]test_accuracy_per_client`).
    """
    global_weights = self.process.get_model_weights(state)
    clients = self._benign(self.experiment.data.client_ids)
    models = {'': (global_weights, clients)}
    released = {}
    if self._personal is not None:
      trained = set(self._personal.trained_client_ids())
      personalized = [cid for cid in clients if cid in trained]
      released['personal_clients_untrained'] = float(
          len(clients) - len(personalized))
      models = {'global_': (global_weights, clients)}
      if personalized:
        models[''] = (self._personal.lookup(global_weights), personalized)
    per_client_values = {}
    for prefix, (weights, ids) in models.items():
      metrics = self.evaluate(weights, client_ids=ids)
      stats = per_client.summarize_clients(metrics)
      released.update(stats['accuracy'].as_dict(f'{prefix}test_accuracy_'))
      released[f'{prefix}test_loss_mean'] = stats['loss'].mean
      per_client_values[f'{prefix}test_accuracy_per_client'] = np.array(
          [m.accuracy for m in metrics.values()], np.float32)
    return released, per_client_values

  def _benign(self, client_ids: Sequence[str]) -> list[str]:
    """`client_ids` without the malicious clients."""
    return [cid for cid in client_ids if cid not in self.malicious]

  def _write_final(
      self, evaluations: Mapping[str, Mapping[str, ClientMetrics]]
  ) -> None:
    out = self.config.output_dir
    fields = ['model', 'client', 'malicious', 'num_examples', 'loss',
              'accuracy', 'balanced_accuracy']

    def write_csv(f):
      writer = csv.DictWriter(f, fieldnames=fields)
      writer.writeheader()
      for kind, metrics in evaluations.items():
        for cid, m in metrics.items():
          writer.writerow({'model': kind, 'client': cid,
                           'malicious': int(cid in self.malicious),
                           **dataclasses.asdict(m)})

    files.write_atomically(os.path.join(out, 'clients_final.csv'), write_csv)
    summary = {}
    for kind, metrics in evaluations.items():
      groups = {kind: metrics}
      if self.malicious:
        groups[f'{kind}:benign'] = {
            c: m for c, m in metrics.items() if c not in self.malicious}
        groups[f'{kind}:malicious'] = {
            c: m for c, m in metrics.items() if c in self.malicious}
      for name, group in groups.items():
        summary[name] = {
            metric: dataclasses.asdict(stats) for metric, stats in
            per_client.summarize_clients(group).items()}
    files.write_atomically(os.path.join(out, 'summary.json'),
                      lambda f: json.dump(summary, f, indent=2))
    for kind, metrics in evaluations.items():
      shown = {c: m for c, m in metrics.items() if c not in self.malicious}
      logging.info(
          'Per-client test metrics of the %s model(s)%s:\n%s', kind,
          ' (benign clients)' if self.malicious else '',
          per_client.format_table(shown))


def prepare(
    config: config_lib.RunConfig, *, start_over: bool = False
) -> tuple[run_dir.Plan, experiment_lib.Experiment]:
  """Every check `run` makes before it writes anything; writes nothing.

  Args:
    config: The run's settings (already validated by `RunConfig`).
    start_over: As in `run`.

  Returns:
    What to do with the output directory, and the loaded experiment.

  Raises:
    errors.UserError: For a bad setting, file, data or run directory.
  """
  plan = run_dir.inspect(config, start_over=start_over)
  return plan, experiment_lib.build_experiment(config)


def run(config: config_lib.RunConfig, *, start_over: bool = False,
        checkpoint_fallback: bool = False) -> RunResult:
  """Checks everything, prepares the output directory and trains.

  Nothing is written to `config.output_dir` before the settings, the output
  directory (`run_dir.inspect`), the data, the model and the files named by
  the settings have been checked.

  Args:
    config: The run's settings.
    start_over: Discard a run saved in the output directory and train from
      round 0 (instead of resuming it, or refusing a directory whose
      checkpoints or settings are missing).
    checkpoint_fallback: Resume from the newest intact checkpoint when the
      latest is damaged (instead of stopping with its path).

  Raises:
    errors.UserError: For a bad setting, file, data or run directory.
  """
  plan, experiment = prepare(config, start_over=start_over)
  # A failure from here to the first checkpoint leaves only config.json,
  # which the next start replaces (run_dir's 'unstarted').
  plan.apply()
  return Trainer(experiment).run(checkpoint_fallback=checkpoint_fallback)
