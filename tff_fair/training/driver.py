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
                           by round in step with the checkpoints
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
from tff_fair.algorithms import aequa
from tff_fair.algorithms import ditto
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import local_training
from tff_fair.evaluation import per_client
from tff_fair.runtime import remote
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import files
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
    x, y = data.arrays(cid, 'train')
    if cid in poisoned:
      y = attacks.poison_labels(y, data.source.num_classes, config.seed,
                                index[cid])
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
  if config.algorithm == 'aequa':
    return aequa.build_aequa(
        experiment.model_spec.model_fn, client_optimizer=client_optimizer,
        server_optimizer=server_optimizer, model_aggregator=aggregator,
        p_min=config.p_min, p_max=config.p_max,
        widths_per_step=config.widths_per_step)
  if config.algorithm == 'ditto':
    return ditto.build_ditto(
        experiment.model_spec.model_fn,
        client_optimizer=client_optimizer,
        server_optimizer=server_optimizer,
        personal_optimizer=optimizer(config.personal_optimizer,
                                     config.personal_learning_rate),
        model_aggregator=aggregator)
  return fed_avg.build_fed_avg(experiment.model_spec.model_fn,
                               client_optimizer, server_optimizer, aggregator)


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
      self._personal = personal_lib.PersonalModels(
          os.path.join(out, 'personal'),
          experiment.model_spec.initial_weights(config.seed), lambdas)
    # Created when the run starts: both create files and folders.
    self._state_manager = None
    self._releases = None

  def _initial_state(self):
    state = self.process.initialize()
    return self.process.set_model_weights(
        state, self.experiment.model_spec.initial_weights(self.config.seed))

  def _restore(self, checkpoint_fallback: bool = False):
    """(state, round) from the latest checkpoint, or a fresh round-0 state.

    A damaged latest checkpoint stops the run with its path, or with
    `checkpoint_fallback` gives way to the newest intact one whose personal
    models are kept (`run_dir.load_checkpoint`).
    """
    out = self.config.output_dir
    initial = self._initial_state()
    self._state_manager = tff.program.FileProgramStateManager(
        run_dir.checkpoint_dir(out), keep_total=3, keep_first=True)

    def personal_kept(version: int):
      manifest = os.path.join(out, 'personal', 'manifests', f'v{version}.json')
      if self._personal is None or not version or os.path.exists(manifest):
        return None
      return 'its personal models were not kept'

    state, version = run_dir.load_checkpoint(
        out, run_dir.checkpoint_versions(out),
        lambda v: asyncio.run(self._state_manager.load(v, initial)),
        fallback=checkpoint_fallback, usable=personal_kept)
    if state is None:
      asyncio.run(self._state_manager.save(initial, 0))
      state, version = initial, 0
    if self._personal is not None:
      self._personal.open(version)
    return state, version

  def evaluate(
      self, weights: per_client.WeightsSource, split: str = 'test',
      plain: bool = False,
  ) -> dict[str, ClientMetrics]:
    """Per-client metrics of global or per-client `weights` on `split`.

    `plain=True` evaluates weights of the architecture without a width
    input (local training's models).
    """
    data = self.experiment.data
    evaluator = self._plain_evaluator if plain else self._evaluator
    return evaluator.evaluate_clients(
        weights, data.client_ids, lambda cid: data.arrays(cid, split))

  def _train_locally(self, initial_weights, epochs: int, tag: int):
    """Per-client models trained from `initial_weights` (one per client).

    Logs the epochs. Uses the plain architecture (for Aequa: the full-width model without
    a width input; its weights have the same layout).
    """
    config = self.config
    logging.info('Training every client alone for %d epoch(s).', epochs)
    computation = local_training.build_local_training(
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
      evaluations['personalized'] = self.evaluate(
          self._personal.lookup(global_weights))
    self._write_final(evaluations)
    return RunResult(
        rounds_completed=(0 if config.algorithm == 'standalone'
                          else config.rounds),
        resumed_from_round=start_round,
        evaluations=evaluations,
        history=history,
        malicious=self.malicious,
    )

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
                   global_datasets: Sequence[tf.data.Dataset]) -> None:
    """Ditto's personal step for the round's clients, anchored at w^t.

    A client seen for the first time starts from w^t. With a lambda grid, a
    new client trains one candidate per lambda and keeps the one with the
    lowest loss on its validation split (the Ditto paper's heuristic); the
    chosen lambda is stored with its model.
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
    for cid, dataset in zip(sampled, datasets):
      start = self._personal.weights(cid)
      lam = self._personal.lam(cid)
      candidates = [lam] if lam is not None else self._personal.lambda_grid
      for candidate in candidates:
        jobs.append((cid, candidate))
        inputs.append(ditto.personal_input(
            dataset, anchor if start is None else start, candidate))
    outputs = remote.map_clients(self.process.personalize, state, inputs)
    results = {job: out['personal'] for job, out in zip(jobs, outputs)}
    chosen = {}
    undecided = [cid for cid in sampled if self._personal.lam(cid) is None]
    if undecided:
      losses = self._evaluator.evaluate_clients(
          results, [job for job in jobs if job[0] in undecided],
          lambda job: self.experiment.data.arrays(job[0], 'validation'))
      for cid in undecided:
        best = min(self._personal.lambda_grid,
                   key=lambda lam, cid=cid: losses[(cid, lam)].loss)
        chosen[cid] = best
    for cid in sampled:
      lam = chosen.get(cid, self._personal.lam(cid))
      self._personal.write(cid, results[(cid, lam)], round_num, lam)

  def _run_rounds(self, state, start_round: int):
    config = self.config
    if self._releases is None:
      out = config.output_dir
      self._releases = [
          tff.program.CSVFileReleaseManager(
              os.path.join(out, 'metrics.csv'), key_fieldname='round'),
          tff.program.TensorBoardReleaseManager(
              os.path.join(out, 'tensorboard')),
      ]
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
      if self._personal is not None:
        self._personalize(state, sampled, round_num, datasets)
      output = self.process.next(state, [
          fed_avg.client_input(ds, self._client_spec(cid, round_num))
          for cid, ds in zip(sampled, datasets)])
      state = output.state
      released = {
          k.replace('client_work/train/', 'train_'): v
          for k, v in _flatten(output.metrics).items()
          if k.startswith('client_work/train/')
      }
      if config.eval_every and round_num % config.eval_every == 0:
        released.update(self._round_evaluation(state))
      released['seconds'] = time.monotonic() - round_start
      # Client state, then the checkpoint, then pruning: a kill between any
      # two leaves a consistent pair (see tff_fair.state.client_store).
      if self._personal is not None:
        self._personal.commit(round_num)
      asyncio.run(self._state_manager.save(state, round_num))
      if self._personal is not None:
        self._personal.prune(round_num)
      # A release for a round that has no checkpoint is overwritten when
      # that round runs again after a resume.
      for manager in self._releases:
        asyncio.run(manager.release(released, key=round_num))
      history.append(released)
      done = round_num - start_round
      eta = (time.monotonic() - started) / done * (config.rounds - round_num)
      test = (f'  test_acc={released["test_accuracy_mean"]:.4f}'
              if 'test_accuracy_mean' in released else '')
      logging.info(
          'round %d/%d  loss=%.4f  acc=%.4f%s  %.1f s/round  ETA %s',
          round_num, config.rounds, released.get('train_loss', math.nan),
          released.get('train_accuracy', math.nan), test,
          released['seconds'], _format_duration(eta))
    return state, history

  def _client_spec(self, client_id: str, round_num: int):
    """A client's attack and seed input for one round."""
    kind = (self.config.attack if client_id in self.malicious
            else attacks.NONE)
    return attacks.attack_spec(
        kind, self.config.attack_scale,
        seed=shuffle_seed(self.config.seed, round_num, 0, stream=2),
        client_index=self._client_index[client_id])

  def _round_evaluation(self, state) -> dict[str, float]:
    """Test statistics of the model(s) a client would use now.

    For Ditto: the personalized models (`test_*`) and the global model
    (`global_test_*`).
    """
    global_weights = self.process.get_model_weights(state)
    models = {'': global_weights}
    if self._personal is not None:
      models = {'': self._personal.lookup(global_weights),
                'global_': global_weights}
    released = {}
    for prefix, weights in models.items():
      stats = per_client.summarize_clients(self.evaluate(weights))
      released.update(stats['accuracy'].as_dict(f'{prefix}test_accuracy_'))
      released[f'{prefix}test_loss_mean'] = stats['loss'].mean
    return released

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
