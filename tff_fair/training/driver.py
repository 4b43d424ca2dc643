"""The round driver: sampling, rounds, checkpoints, releases, evaluation.

What a program binary and a notebook share. A run is a function of its
`RunConfig`: client sampling and data shuffling for round r are derived from
`(seed, r)` alone, never from the history of a random generator, so a run
resumed from the checkpoint of round r continues exactly as the uninterrupted
run would have.

Output directory layout:

    config.json            the run's settings (checked on resume)
    checkpoints/           tff.program.FileProgramStateManager, one per round
    metrics.csv            per-round release (tff.program.CSVFileReleaseManager)
    tensorboard/           the same values as TensorBoard scalars
    clients_final.csv      per-client test metrics after the last round
    summary.json           statistics over clients after the last round
"""

import asyncio
from collections.abc import Callable, Mapping, Sequence
import csv
import dataclasses
import json
import math
import os
import tempfile
import time
from typing import Any, Optional

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import local_training
from tff_fair.evaluation import per_client
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib

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
  """

  rounds_completed: int
  resumed_from_round: int
  evaluations: dict[str, dict[str, ClientMetrics]]
  history: list[dict[str, float]]


def sample_clients(
    client_ids: Sequence[str], clients_per_round: int, seed: int,
    round_num: int,
) -> list[str]:
  """Uniform sample without replacement, a pure function of (seed, round)."""
  rng = np.random.default_rng([seed, round_num])
  chosen = rng.choice(len(client_ids), size=clients_per_round, replace=False)
  return [client_ids[i] for i in sorted(chosen)]


def shuffle_seed(seed: int, round_num: int, client_index: int) -> int:
  return int(np.random.default_rng([seed, round_num, client_index])
             .integers(0, 2**31 - 1))


def client_datasets(
    experiment: experiment_lib.Experiment,
    client_ids: Sequence[str],
    round_num: int,
    epochs: int,
) -> list[tf.data.Dataset]:
  """Shuffled, repeated, batched training data for `client_ids`."""
  config = experiment.config
  index = {cid: i for i, cid in enumerate(experiment.data.client_ids)}
  datasets = []
  for cid in client_ids:
    n = experiment.data.num_examples(cid, 'train')
    ds = experiment.data.dataset(cid, 'train').shuffle(
        n, seed=shuffle_seed(config.seed, round_num, index[cid]),
        reshuffle_each_iteration=True,
    )
    datasets.append(ds.repeat(epochs).batch(config.batch_size))
  return datasets


def build_process(
    experiment: experiment_lib.Experiment,
) -> tff.learning.templates.LearningProcess:
  """The federated process that trains the global model of a run."""
  config = experiment.config
  return tff.learning.algorithms.build_weighted_fed_avg(
      experiment.model_spec.model_fn,
      client_optimizer_fn=experiment_lib.build_optimizer(
          config.client_optimizer, config.client_learning_rate),
      server_optimizer_fn=experiment_lib.build_optimizer(
          config.server_optimizer, config.server_learning_rate),
  )


def _flatten(metrics: Any, prefix: str = '') -> dict[str, float]:
  flat = {}
  for key, value in metrics.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      flat.update(_flatten(value, name + '/'))
    elif np.ndim(value) == 0:
      flat[name] = float(value)
  return flat


def _write_atomically(path: str, write: Callable[[Any], None]) -> None:
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix='.tmp')
  with os.fdopen(fd, 'w', newline='') as f:
    write(f)
  os.replace(tmp, path)


def _format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f'{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'


class Trainer:
  """Runs, checkpoints and evaluates one configured experiment.

  Attributes:
    experiment: Data, model and configuration.
    process: The `LearningProcess` that trains the global model.
  """

  def __init__(self, experiment: experiment_lib.Experiment):
    self.experiment = experiment
    self.config = experiment.config
    self.process = build_process(experiment)
    self._evaluator = per_client.ClientEvaluator(
        experiment.model_spec.build_keras
    )
    out = self.config.output_dir
    self._state_manager = tff.program.FileProgramStateManager(
        os.path.join(out, 'checkpoints'), keep_total=3, keep_first=True
    )
    self._releases = [
        tff.program.CSVFileReleaseManager(
            os.path.join(out, 'metrics.csv'), key_fieldname='round'),
        tff.program.TensorBoardReleaseManager(os.path.join(out, 'tensorboard')),
    ]

  def _initial_state(self):
    state = self.process.initialize()
    return self.process.set_model_weights(
        state, self.experiment.model_spec.initial_weights(self.config.seed)
    )

  def _restore(self):
    """(state, round) from the latest checkpoint, or a fresh round-0 state."""
    initial = self._initial_state()
    state, version = asyncio.run(self._state_manager.load_latest(initial))
    if state is None:
      asyncio.run(self._state_manager.save(initial, 0))
      return initial, 0
    return state, version

  def evaluate(
      self, weights: per_client.WeightsSource
  ) -> dict[str, ClientMetrics]:
    """Per-client test metrics of global or per-client `weights`."""
    data = self.experiment.data
    return self._evaluator.evaluate_clients(
        weights, data.client_ids,
        lambda cid: data.arrays(cid, 'test'),
    )

  def _train_locally(self, initial_weights, epochs: int, tag: int):
    """Per-client models trained from `initial_weights` (one per client)."""
    config = self.config
    computation = local_training.build_local_training(
        self.experiment.model_spec.model_fn,
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
      datasets = client_datasets(self.experiment, group, tag, epochs=1)
      trained.update(zip(group, computation(initial_weights, datasets)))
    return trained

  def run(self) -> RunResult:
    """Trains to `config.rounds`, resuming from the latest checkpoint."""
    config = self.config
    state, start_round = self._restore()
    if start_round > config.rounds:
      raise config_lib.ConfigError(
          f'{config.output_dir} holds a checkpoint of round {start_round},'
          f' past rounds={config.rounds}; ask for at least {start_round}'
          ' rounds, or use a new --output_dir.')
    if start_round:
      logging.info(
          'Resuming from the checkpoint of round %d in %s; continuing at'
          ' round %d of %d.', start_round, config.output_dir,
          start_round + 1, config.rounds)
    history = []
    evaluations = {}
    if config.algorithm != 'standalone':
      state, history = self._run_rounds(state, start_round)
    global_weights = self.process.get_model_weights(state)
    if config.algorithm == 'fedavg':
      evaluations['global'] = self.evaluate(global_weights)
    elif config.algorithm == 'fedavg_ft':
      evaluations['global'] = self.evaluate(global_weights)
      logging.info('Fine-tuning the global model on every client for %d'
                   ' epoch(s).', config.finetune_epochs)
      evaluations['fine_tuned'] = self.evaluate(self._train_locally(
          global_weights, config.finetune_epochs, tag=config.rounds + 1))
    else:
      epochs = self.standalone_epochs()
      logging.info('Standalone: each client trains alone for %d epoch(s).',
                   epochs)
      evaluations['standalone'] = self.evaluate(
          self._train_locally(global_weights, epochs, tag=0))
    self._write_final(evaluations)
    return RunResult(
        rounds_completed=(0 if config.algorithm == 'standalone'
                          else config.rounds),
        resumed_from_round=start_round,
        evaluations=evaluations,
        history=history,
    )

  def standalone_epochs(self) -> int:
    """The local epochs a client gets in federated training, in expectation.

    A client takes part in clients_per_round / num_clients of the rounds and
    trains local_epochs each time; standalone training gets the same budget.
    """
    c = self.config
    return max(1, round(c.rounds * c.local_epochs * c.clients_per_round /
                        c.num_clients))

  def _run_rounds(self, state, start_round: int):
    config = self.config
    history = []
    started = time.monotonic()
    for round_num in range(start_round + 1, config.rounds + 1):
      round_start = time.monotonic()
      sampled = sample_clients(self.experiment.data.client_ids,
                               config.clients_per_round, config.seed,
                               round_num)
      datasets = client_datasets(self.experiment, sampled, round_num,
                                 config.local_epochs)
      output = self.process.next(state, datasets)
      state = output.state
      released = {
          k.replace('client_work/train/', 'train_'): v
          for k, v in _flatten(output.metrics).items()
          if k.startswith('client_work/train/')
      }
      if config.eval_every and round_num % config.eval_every == 0:
        stats = per_client.summarize_clients(
            self.evaluate(self.process.get_model_weights(state)))
        released.update(stats['accuracy'].as_dict('test_accuracy_'))
        released['test_loss_mean'] = stats['loss'].mean
      released['seconds'] = time.monotonic() - round_start
      # Checkpoint first: a release for a round that has no checkpoint is
      # overwritten when that round runs again after a resume.
      asyncio.run(self._state_manager.save(state, round_num))
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

  def _write_final(
      self, evaluations: Mapping[str, Mapping[str, ClientMetrics]]
  ) -> None:
    out = self.config.output_dir
    fields = ['model', 'client', 'num_examples', 'loss', 'accuracy',
              'balanced_accuracy']

    def write_csv(f):
      writer = csv.DictWriter(f, fieldnames=fields)
      writer.writeheader()
      for kind, metrics in evaluations.items():
        for cid, m in metrics.items():
          writer.writerow({'model': kind, 'client': cid,
                           **dataclasses.asdict(m)})

    _write_atomically(os.path.join(out, 'clients_final.csv'), write_csv)
    summary = {
        kind: {name: dataclasses.asdict(stats) for name, stats in
               per_client.summarize_clients(metrics).items()}
        for kind, metrics in evaluations.items()
    }
    _write_atomically(os.path.join(out, 'summary.json'),
                      lambda f: json.dump(summary, f, indent=2))
    for kind, metrics in evaluations.items():
      logging.info('Per-client test metrics of the %s model(s):\n%s', kind,
                   per_client.format_table(metrics))


def run(config: config_lib.RunConfig) -> RunResult:
  """Checks the output directory, builds the experiment and trains.

  Nothing is written to `config.output_dir` before the configuration has
  been checked against a saved run and the data has loaded.
  """
  config_lib.check_resumable(config)
  trainer = Trainer(experiment_lib.build_experiment(config))
  config_lib.save_if_new(config)
  return trainer.run()
