"""What an algorithm brings to a run: the `Recipe` base class.

The driver (`tff_fair.training.driver`) knows no algorithm: it samples
clients, runs rounds, checkpoints, releases and resumes. Everything that is
one algorithm's is its recipe, one module under this package:

* its own settings: a frozen dataclass of `config.setting` fields (their
  flags are generated from it), checked by its `__post_init__`, and
  `check_config` for checks against the shared settings;
* the shared settings it acts on (`reads`, `settings_read`): a run refuses
  any other given to it, and a resume compares only these;
* building its `tff.learning.templates.LearningProcess`;
* a round: `before_round` returns its plan (a `Round`), which the driver
  hands to `client_input`, `run_round` and `after_round`; per-client state
  is kept in `RunContext.client_model_store` stores the driver versions
  with the checkpoints;
* what it evaluates per round (`evaluation_models`) and after the last round
  (`final_evaluations`, with any tables of its own), both from the server
  state; what its round's log line shows (`progress_fields`).

A run makes one recipe instance, after the data is loaded. The registry
(`registry.RECIPES`) maps `--algorithm` names to recipe classes. The base
class is FedAvg's behaviour everywhere except the process, so a recipe
overrides only what it changes.

Adding an algorithm: its process (in `tff_fair/algorithms/`, or TFF's own),
its recipe module here (declaring in `reads` the shared settings its
process really uses), its test under `tests/training/recipes/`, and one
line in `registry.py` (see `fedprox.py`, the smallest recipe).
`tests/training/recipes/settings_read_test.py` then checks the declaration
both ways: every setting it leaves out is refused, and changing every
setting it declares changes the run.
"""

from collections.abc import Mapping, Sequence
import dataclasses
from typing import Any, ClassVar, Union

import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import fed_avg
from tff_fair.evaluation import per_client
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import run_context

ClientMetrics = per_client.ClientMetrics
# Per-round evaluation: name prefix -> (weights, the clients to measure),
# or (weights, clients, their model variant: one for all, or client id ->
# its variant, as `RunContext.evaluate` takes it; default the trained one).
EvaluationModels = dict[str, Union[
    tuple[per_client.WeightsSource, list[str]],
    tuple[per_client.WeightsSource, list[str], run_context.Variants]]]


@dataclasses.dataclass
class Round:
  """One round, from `Recipe.before_round` to `Recipe.after_round`.

  A recipe that needs more until the round ends subclasses it (e.g.
  Ditto's `_Round`: lambdas due, the anchor, records of the personal
  step), so nothing of one round is left on the recipe.

  Attributes:
    number: The round.
    client_ids: Its sampled clients, in order.
    state: The server state it starts from.
  """

  number: int
  client_ids: tuple[str, ...]
  state: Any


class Recipe:
  """One algorithm in a run. Subclass it; override what the algorithm changes.

  Class attributes (read before the data is loaded):
    name: The `--algorithm` name.
    Settings: The frozen dataclass of the algorithm's own settings
      (`config.NoSettings` when it has none).
    slimmable: Whether it trains the slimmable version of the architecture
      (whose input carries a width).
    client_context: Whether its process takes TFF's client context input
      (`fed_avg.client_input`: attack specs and per-client seeds). A process
      without it (e.g. TFF's own) takes plain client datasets and cannot run
      the update attacks (A2, A3).
    trains_federated: False for an algorithm with no federated rounds
      (standalone training): the driver runs none.
    output_files: Files of its own in the output directory (removed by
      `--start_over` with the run's other outputs).
    client_state_dirs: Folders of its `RunContext.client_model_store` stores.
    reads: The shared settings of `config.ALGORITHM_DEPENDENT` it acts on,
      and for each the values it acts on (None: every value); FedAvg's by
      default (`config.READS_ALL`). Declare exactly what the process and
      the recipe use: a run refuses any other setting given a value other
      than its default, naming the algorithms that read it.
    ignored_because: Why it ignores a setting (or its other values), for
      the refusal: setting -> a clause, e.g. 'standalone clients send no
      updates'.
    runs_on_several_workers: False when its round returns per-client values
      (`client_outputs`), which TFF's multi-worker context cannot return;
      a run on several remote workers is then refused before it starts.
    progress_fields: Released values the round's log line shows besides
      the shared ones: (name, label) pairs, e.g. Ditto's worst personal
      training accuracy.
    required_settings: Shared settings whose default the algorithm cannot
      run with (its `check_config` refuses it, naming the flag), each with
      a value that works on the bundled digits; the tests that run every
      recipe of the registry pass them (FedDF's public and validation
      sets).

  Attributes:
    context: The run's shared parts.
    config: The run's settings.
    settings: The algorithm's own settings (`config.settings`).
  """

  name: ClassVar[str] = ''
  Settings: ClassVar[type[Any]] = config_lib.NoSettings
  slimmable: ClassVar[bool] = False
  client_context: ClassVar[bool] = True
  trains_federated: ClassVar[bool] = True
  output_files: ClassVar[tuple[str, ...]] = ()
  client_state_dirs: ClassVar[tuple[str, ...]] = ()
  reads: ClassVar[config_lib.Reads] = config_lib.READS_ALL
  ignored_because: ClassVar[Mapping[str, str]] = {}
  runs_on_several_workers: ClassVar[bool] = True
  progress_fields: ClassVar[tuple[tuple[str, str], ...]] = ()
  required_settings: ClassVar[Mapping[str, Any]] = {}

  # --- Before the data is loaded (class methods). ---

  @classmethod
  def check_config(cls, config: config_lib.RunConfig) -> config_lib.RunConfig:
    """Checks the own settings against the shared ones; may resolve them.

    Args:
      config: Shared settings, each valid, with `settings` of this recipe.

    Returns:
      `config`, or a copy whose settings are resolved (e.g. a rate of 0
      meaning the client learning rate): what config.json records.

    Raises:
      config.ConfigError: Naming the settings that disagree.
    """
    return config

  @classmethod
  def settings_read(cls, config: config_lib.RunConfig) -> config_lib.Reads:
    """What a run of `config` reads: `reads`, as its settings make it.

    By default `reads`, plus the server's held-out sets when the final
    models are also measured on the common test set
    (`common_test_evaluation`), which they then are. A recipe whose use of
    a shared setting depends on its own settings overrides this.
    """
    if config.common_test_evaluation:
      return {'server_held_out_examples': None, **cls.reads}
    return cls.reads

  @classmethod
  def model_variants(cls, config: config_lib.RunConfig) -> dict[str, str]:
    """Model variants beside the trained one: name -> architecture.

    For an algorithm whose clients train several architectures (e.g. a
    federation of LeNets and CNNs): the experiment binds each to the data
    (`Experiment.model_specs`), and evaluation groups clients by variant
    (`RunContext.evaluate(..., variant=...)`). None by default.
    """
    del config  # The base trains one architecture.
    return {}

  @classmethod
  def needed_splits(cls, config: config_lib.RunConfig) -> tuple[str, ...]:
    """The splits every client must have examples in."""
    del config  # Unused by the base.
    return ('train', 'test')

  @classmethod
  def check_client_files(cls, config: config_lib.RunConfig,
                         client_ids: Sequence[str]) -> None:
    """Reads the per-client files its settings name; refuses bad ones.

    Raises:
      config.ConfigError: Naming the file and what is wrong with it.
    """
    del config, client_ids  # The base reads no file.

  # --- A run. ---

  def __init__(self, context: run_context.RunContext):
    self.context = context
    self.config = context.config
    self.settings = context.config.settings

  def build_process(self) -> tff.learning.templates.LearningProcess:
    """The process that trains the global model (state, `next`, weights)."""
    raise NotImplementedError(f'{type(self).__name__}.build_process')

  def client_optimizer(self) -> tff.learning.optimizers.Optimizer:
    """The shared settings' client optimizer."""
    return experiment_lib.build_optimizer(self.config.client_optimizer,
                                          self.config.client_learning_rate)

  def server_optimizer(self) -> tff.learning.optimizers.Optimizer:
    """The shared settings' server optimizer."""
    return experiment_lib.build_optimizer(self.config.server_optimizer,
                                          self.config.server_learning_rate)

  def model_aggregator(self) -> tff.aggregators.AggregationFactory:
    """The shared settings' aggregator of the global model's updates."""
    return experiment_lib.build_aggregator(self.config)

  @property
  def model_fn(self):
    """The trained architecture's `tff.learning` model builder."""
    return self.context.experiment.model_spec.model_fn

  def before_round(self, state: Any, client_ids: Sequence[str],
                   round_num: int, datasets: Sequence[tf.data.Dataset]
                   ) -> 'Round':
    """Plans round `round_num` (e.g. Ditto's personal step runs here).

    Args:
      state: The server state the round starts from.
      client_ids: The round's sampled clients.
      round_num: The round about to train.
      datasets: The clients' data of the global update, in order.

    Returns:
      The round's plan, which the driver hands to `client_input`,
      `run_round` and `after_round`: a `Round`, or a subclass with what
      the recipe needs until the round ends (never kept on the recipe).
    """
    del datasets  # The base needs no more than the round's clients.
    return Round(round_num, tuple(client_ids), state)

  def client_input(self, plan: 'Round', client_id: str,
                   dataset: tf.data.Dataset, attack: Any) -> Any:
    """One client's input to `next` when `client_context` is on.

    Args:
      plan: The round's plan (`before_round`'s).
      client_id: The client.
      dataset: Its data for the round.
      attack: Its attack spec and seed (`update_attacks.attack_spec`).

    Returns:
      By default `fed_avg.client_input(dataset, attack)`; a recipe whose
      process takes more per client (e.g. a width) builds that here.
    """
    del plan, client_id  # The same for every client by default.
    return fed_avg.client_input(dataset, attack)

  def run_round(self, plan: 'Round',
                process: tff.learning.templates.LearningProcess,
                state: Any, client_inputs: Sequence[Any]
                ) -> client_outputs.RoundOutput:
    """The round's federated computation: `process.next` by default.

    A recipe that needs what each client computed (e.g. updates to assess
    contributions) calls `next_with_client_outputs` and returns its
    clients' values with the state and metrics.

    Returns:
      The new state, the round's metrics and the clients' values (None for
      `next`), handed to `after_round`.
    """
    del plan  # The base runs the same round whatever the plan.
    output = process.next(state, client_inputs)
    return client_outputs.RoundOutput(output.state, output.metrics, None)

  def after_round(self, plan: 'Round',
                  output: client_outputs.RoundOutput) -> dict[str, float]:
    """Runs after the round, before the stores are committed.

    Args:
      plan: The round's plan.
      output: `run_round`'s.

    Returns:
      Values to release with the round's metrics.
    """
    del plan, output
    return {}

  def evaluation_models(
      self, state: Any, global_weights: tff.learning.models.ModelWeights,
      client_ids: list[str],
  ) -> tuple[EvaluationModels, dict[str, float]]:
    """The models a per-round evaluation measures on the clients' test data.

    Args:
      state: The server state after the round (a recipe whose state holds
        several models, e.g. clusters, measures them).
      global_weights: The global model after the round.
      client_ids: The clients to measure (the benign ones).

    Returns:
      (prefix -> (weights, clients) or (weights, clients, variant), values
      to release besides), released as `<prefix>test_accuracy_*`
      statistics over those clients (a variant for clients of several
      architectures: `EvaluationModels`).
    """
    del state  # The base measures the global model.
    return {'': (global_weights, client_ids)}, {}

  def final_evaluations(
      self, state: Any, global_weights: tff.learning.models.ModelWeights
  ) -> dict[str, Mapping[str, ClientMetrics]]:
    """Model kind -> per-client test metrics, after the last round.

    Written to clients_final.csv and summary.json; a recipe writes any
    tables of its own here too. Measure each kind with
    `RunContext.final_metrics`, which adds its common-test metrics when the
    run asks for them.

    Args:
      state: The server state of the last round (also when a finished run
        is only re-evaluated).
      global_weights: Its global model.
    """
    del state  # The base measures the global model.
    return self.context.final_metrics('global', global_weights)
