"""The round driver: rounds, checkpoints, releases, resume; no algorithm.

What a program binary and a notebook share. A run is a function of its
`RunConfig`: client sampling and data shuffling for round r are derived from
`(seed, r)` alone (`sampling`), never from the history of a random
generator, so a run resumed from the checkpoint of round r continues exactly
as the uninterrupted run would have. Everything one algorithm does is its
recipe's (`tff_fair.training.recipes`), looked up by `config.algorithm`.

Output directory layout:

    config.json            the run's settings (checked on resume)
    checkpoints/           tff.program.FileProgramStateManager, one per round
    metrics.csv            per-round release (tff.program.CSVFileReleaseManager)
    tensorboard/           the same values as TensorBoard scalars
    clients_final.csv      per-client test metrics after the last round
    summary.json           statistics over clients after the last round
    ...                    the algorithm's own (its recipe's `output_files`
                           and `client_state_dirs`: e.g. Ditto's personal/
                           models, versioned by round in step with the
                           checkpoints, and personal_rounds.csv)
"""

import asyncio
import dataclasses
import math
import time
from typing import Any, Optional

from absl import logging
import tensorflow_federated as tff

from tff_fair.algorithms import update_attacks
from tff_fair import attacks
from tff_fair.evaluation import per_client
from tff_fair.runtime import remote
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training.recipes import recipe as recipe_lib
from tff_fair.training.recipes import registry
from tff_fair.training import reports
from tff_fair.training import run_context
from tff_fair.training import run_dir
from tff_fair.training import sampling

ClientMetrics = per_client.ClientMetrics
# The seed stream of the per-client, per-round seeds of client context.
CLIENT_SEED_STREAM = 2
# Released values every round's log line shows when present (a recipe adds
# its own: `Recipe.progress_fields`).
_PROGRESS_FIELDS = (('test_accuracy_mean', 'test_acc'),
                    ('dp_epsilon', 'epsilon'))


@dataclasses.dataclass
class RunResult:
  """What a finished run produced.

  Attributes:
    rounds_completed: The last federated round in the checkpoint.
    resumed_from_round: The checkpoint round this invocation started from
      (0 for a fresh run).
    evaluations: Model kind (e.g. 'global'; the recipe's
      `final_evaluations`) -> client id -> metrics on that client's test
      split.
    history: One dict of released values per round run in this invocation,
      and the round's `seconds_checkpoint` (released rows cannot hold it).
    malicious: The clients that attacked (empty without an attack).
  """

  rounds_completed: int
  resumed_from_round: int
  evaluations: dict[str, dict[str, ClientMetrics]]
  history: list[dict[str, float]]
  malicious: frozenset[str] = frozenset()


class Trainer:
  """Runs, checkpoints and evaluates one configured experiment.

  Attributes:
    experiment: Data, model and configuration.
    context: The shared parts the recipe uses (data as clients train on it,
      evaluation, per-client state).
    recipe: The algorithm's recipe.
    process: The `LearningProcess` that trains the global model.
    malicious: The clients that attack (empty without an attack).
  """

  def __init__(self, experiment: experiment_lib.Experiment):
    self.experiment = experiment
    self.config = experiment.config
    self.context = run_context.RunContext(experiment)
    self.recipe = registry.get(self.config.algorithm)(self.context)
    self.process = self.recipe.build_process()
    self.malicious = self.context.malicious
    # Created when the run starts: both create files and folders.
    self._state_manager = None
    self._csv_release = None
    self._tensorboard = None
    self._divergence_reported = False

  def _initial_state(self):
    state = self.process.initialize()
    return self.process.set_model_weights(
        state, self.experiment.model_spec.initial_weights(self.config.seed))

  def _restore(self, checkpoint_fallback: bool = False):
    """(state, round) from the latest checkpoint, or a fresh round-0 state.

    A damaged latest checkpoint stops the run with its path, or with
    `checkpoint_fallback` gives way to the newest intact one; the recipe's
    per-client state is opened at that round (`run_dir.load_checkpoint`
    refuses a round whose per-client state is gone).
    """
    out = self.config.output_dir
    initial = self._initial_state()
    self._state_manager = tff.program.FileProgramStateManager(
        run_dir.checkpoint_dir(out), keep_total=3, keep_first=True)
    stores = self.context.stores
    kept = {name: set(store.committed_versions())
            for name, store in stores.items()}

    def state_kept(version: int):
      missing = [name for name in stores if version not in kept[name]]
      if not version or not missing:
        return None
      # Run directories of tff_fair before the stores kept several rounds
      # hold the latest round's state only.
      return (f'its per-client state ({", ".join(f"{n}/" for n in missing)})'
              ' was not kept: this run directory was written by an older'
              " tff_fair that kept only the latest round's")

    state, version = run_dir.load_checkpoint(
        out, run_dir.checkpoint_versions(out),
        lambda v: asyncio.run(self._state_manager.load(v, initial)),
        fallback=checkpoint_fallback, usable=state_kept)
    if state is None:
      asyncio.run(self._state_manager.save(initial, 0))
      state, version = initial, 0
    for store in stores.values():
      store.open(version)
    for log in self.context.round_logs:
      log.open(version)
    return state, version

  def run(self, checkpoint_fallback: bool = False) -> RunResult:
    """Trains to `config.rounds`, resuming from the latest checkpoint, then
    runs the recipe's final evaluations and writes the final tables.

    Args:
      checkpoint_fallback: Resume from the newest intact checkpoint when the
        latest is damaged (see `_restore`).
    """
    config = self.config
    state, start_round, history = self.train(checkpoint_fallback)
    evaluations = self.recipe.final_evaluations(
        state, self.process.get_model_weights(state))
    reports.write_final(config.output_dir, evaluations, self.malicious,
                        privacy=reports.privacy(config, self.rounds_trained()),
                        rotated=self.experiment.data.rotated_clients)
    return RunResult(
        rounds_completed=self.rounds_trained(),
        resumed_from_round=start_round,
        evaluations={kind: dict(m) for kind, m in evaluations.items()},
        history=history,
        malicious=self.malicious,
    )

  def rounds_trained(self) -> int:
    """The federated rounds the final model has had (0 without rounds)."""
    return self.config.rounds if self.recipe.trains_federated else 0

  def train(self, checkpoint_fallback: bool = False
            ) -> tuple[Any, int, list[dict[str, float]]]:
    """The federated rounds of `run`, without its final evaluations.

    Returns:
      (the server state after the last round, the checkpoint round this
      invocation started from, the released values of each round run; see
      `RunResult.history`).
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
    federated = self.recipe.trains_federated
    if start_round >= config.rounds and federated:
      logging.info(
          'The checkpoint of round %d in %s ends the run; re-evaluating'
          ' only.', start_round, config.output_dir)
    elif start_round:
      logging.info(
          'Resuming from the checkpoint of round %d in %s; continuing at'
          ' round %d of %d.', start_round, config.output_dir,
          start_round + 1, config.rounds)
    history = []
    if federated:
      state, history = self._run_rounds(state, start_round)
    return state, start_round, history

  def _run_rounds(self, state, start_round: int):
    config = self.config
    if self._csv_release is None:
      out = config.output_dir
      self._csv_release = tff.program.CSVFileReleaseManager(
          f'{out}/metrics.csv', key_fieldname='round')
      self._tensorboard = tff.program.TensorBoardReleaseManager(
          f'{out}/tensorboard')
    history = []
    started = time.monotonic()
    for round_num in range(start_round + 1, config.rounds + 1):
      round_start = time.monotonic()
      timer = reports.PhaseTimer()
      with timer.phase('data'):
        sampled = sampling.sample_clients(self.experiment.data.client_ids,
                                          config.clients_per_round,
                                          config.seed, round_num)
        datasets = self.context.client_datasets(sampled, round_num,
                                                config.local_epochs)
      with timer.phase('train'):
        # Before `next`: a recipe's client step is anchored at the state the
        # round starts from.
        plan = self.recipe.before_round(state, sampled, round_num, datasets)
        if self.recipe.client_context:
          datasets = [
              self.recipe.client_input(plan, cid, ds,
                                       self._client_spec(cid, round_num))
              for cid, ds in zip(sampled, datasets)]
        output = self.recipe.run_round(plan, self.process, state, datasets)
        state = output.state
        released = reports.training_metrics(output.metrics)
        released.update(self.recipe.after_round(plan, output))
        released.update(reports.privacy(config, round_num))
      with timer.phase('client_state'):
        # Client state, then the checkpoint, then pruning: a kill between
        # any two leaves a consistent pair (see tff_fair.state.client_store).
        for store in self.context.stores.values():
          store.commit(round_num)
      # After the commit: the round's client state is the current one.
      per_client_values = {}
      if config.eval_every and round_num % config.eval_every == 0:
        with timer.phase('evaluation'):
          over_clients, per_client_values = self._round_evaluation(state)
        released.update(over_clients)
      released.update(timer.released())
      released['seconds'] = time.monotonic() - round_start
      with timer.phase('checkpoint'):
        # Released before the checkpoint: a kill after the checkpoint would
        # otherwise lose the round's row for good (a resume starts after
        # it), while a round released without its checkpoint runs again and
        # its release replaces the old one (the CSV manager drops rows >=
        # key; TensorBoard purges steps it sees again). So the checkpoint's
        # own seconds are logged, not released.
        asyncio.run(self._csv_release.release(released, key=round_num))
        # Arrays become TensorBoard histograms: fairness as a distribution.
        asyncio.run(self._tensorboard.release(
            {**released, **per_client_values}, key=round_num))
        asyncio.run(self._state_manager.save(state, round_num))
        kept = run_dir.checkpoint_versions(config.output_dir)
        for store in self.context.stores.values():
          # The saved checkpoints' rounds (the manager has pruned its own).
          store.prune(round_num, keep=kept)
      history.append({**released, **timer.released()})
      self._log_round(round_num, released, started, start_round,
                      timer.released())
      self._report_divergence(round_num, released)
    return state, history

  def _log_round(self, round_num: int, released: dict[str, float],
                 started: float, start_round: int,
                 phases: dict[str, float]) -> None:
    config = self.config
    done = round_num - start_round
    eta = (time.monotonic() - started) / done * (config.rounds - round_num)
    shown = ''.join(
        f'  {label}={released[name]:.4g}'
        for name, label in (*_PROGRESS_FIELDS, *self.recipe.progress_fields)
        if name in released)
    logging.info(
        'round %d/%d  loss=%.4f  acc=%.4f%s  %.1f s/round  ETA %s',
        round_num, config.rounds, released.get('train_loss', math.nan),
        released.get('train_accuracy', math.nan), shown,
        released['seconds'], reports.format_duration(eta))
    logging.info('round %d seconds: %s', round_num, '  '.join(
        f'{name.removeprefix("seconds_")}={s:.2f}'
        for name, s in phases.items()))

  def _report_divergence(self, round_num: int,
                         released: dict[str, float]) -> None:
    """Warns, once a run, when the training loss stops being finite.

    A diverged model still yields accuracies (near chance), so a table of
    results alone would not show it.
    """
    loss = released.get('train_loss')
    if self._divergence_reported or loss is None or math.isfinite(loss):
      return
    self._divergence_reported = True
    logging.warning(
        'Round %d: the training loss is %s: the global model has diverged,'
        ' and its accuracies from here on say little. Lower'
        ' --client_learning_rate or --server_learning_rate; with'
        ' --aggregator=dp, lower the noise (a larger --dp_target_epsilon,'
        ' more --clients_per_round).', round_num, loss)

  def _client_spec(self, client_id: str, round_num: int):
    """A client's attack and seed input for one round."""
    kind = (self.config.attack if client_id in self.malicious
            else attacks.NONE)
    return update_attacks.attack_spec(
        kind, self.config.attack_scale,
        seed=sampling.shuffle_seed(self.config.seed, round_num, 0,
                                   stream=CLIENT_SEED_STREAM),
        client_index=self.context.client_index[client_id])

  def _round_evaluation(self, state) -> tuple[dict[str, float], dict[str, Any]]:
    """Test statistics of the model(s) the recipe measures each round.

    Benign clients only when an attack is on, as the Ditto paper reports.

    Returns:
      (statistics over clients, per-client test accuracies as arrays named
      `<prefix>test_accuracy_per_client`).
    """
    models, released = self.recipe.evaluation_models(
        state, self.process.get_model_weights(state),
        self.context.benign(self.experiment.data.client_ids))
    per_client_values = {}
    for prefix, (weights, ids, *variant) in models.items():
      variant = variant[0] if variant else experiment_lib.TRAINED
      stats, accuracies = reports.test_statistics(
          prefix, self.context.evaluate(weights, client_ids=ids,
                                        variant=variant))
      released.update(stats)
      per_client_values[f'{prefix}test_accuracy_per_client'] = accuracies
    return released, per_client_values


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
  recipe = recipe_type(config)  # Refuses a config not made for it.
  registry.check_workers(config.algorithm, remote.worker_count())
  plan = run_dir.inspect(config, start_over=start_over, layout=layout(),
                         reads=recipe.settings_read(config))
  return plan, build_experiment(config)


def recipe_type(config: config_lib.RunConfig) -> type[recipe_lib.Recipe]:
  """The recipe of `config.algorithm`, checked against `config.settings`.

  Raises:
    config.ConfigError: For an unknown algorithm, or settings of another.
  """
  recipe = registry.get(config.algorithm)
  if not isinstance(config.settings, recipe.Settings):
    raise config_lib.ConfigError(
        f'config.settings is a {type(config.settings).__name__}, not the'
        f' settings of --algorithm={config.algorithm}; build the config with'
        ' tff_fair.training.recipes.registry.make_config.')
  return recipe


def build_experiment(config: config_lib.RunConfig,
                     max_examples: Optional[int] = None
                     ) -> experiment_lib.Experiment:
  """The data and model of `config`, as its algorithm needs them.

  `experiment.build_experiment` with the recipe's architecture and splits,
  then the recipe's check of the files its settings name.

  Raises:
    errors.UserError: For a bad setting, file, data or model.
  """
  recipe = recipe_type(config)
  experiment = experiment_lib.build_experiment(
      config, max_examples, slimmable=recipe.slimmable,
      needed_splits=recipe.needed_splits(config),
      variants=recipe.model_variants(config))
  recipe.check_client_files(config, experiment.data.client_ids)
  return experiment


def layout() -> run_dir.Layout:
  """Every algorithm's own outputs a run directory may hold."""
  return run_dir.Layout(files=registry.output_files(),
                        state_dirs=registry.client_state_dirs())


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
