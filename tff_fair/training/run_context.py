"""What the driver gives a recipe: the run's data, evaluation and state.

A recipe (`tff_fair.training.recipes`) trains one algorithm; everything it
shares with the others (the clients' data as they train on it, per-client
evaluation, training one model per client, per-client state kept on disk in
step with the checkpoints) comes from its `RunContext`, so a recipe holds
only what is its own.
"""

from collections.abc import Mapping, Sequence
import os
from typing import Any, Optional, Union

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair import attacks
from tff_fair.algorithms import per_client_training
from tff_fair.evaluation import per_client
from tff_fair.models import parts
from tff_fair.runtime import remote
from tff_fair.state import round_state
from tff_fair.training import client_models
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import sampling

ClientMetrics = per_client.ClientMetrics
# Suffix of a final model kind measured on the common test set.
COMMON_TEST = ':common_test'
# A model variant for every client, or client id -> its variant.
Variants = Union[str, Mapping[str, str]]


class RunContext:
  """The shared parts of one run, for its recipe.

  Attributes:
    experiment: Data, model and configuration.
    config: The run's settings (`experiment.config`).
    malicious: The clients that attack (empty without an attack).
    poisoned: The clients whose training labels are random (attack A1).
    label_noise: Client -> the fraction of its training labels replaced by
      random ones (`--label_noise_file`; 1 for the poisoned clients).
    client_index: Client id -> position in `experiment.data.client_ids`.
  """

  def __init__(self, experiment: experiment_lib.Experiment):
    self.experiment = experiment
    self.config = config = experiment.config
    client_ids = experiment.data.client_ids
    self.malicious = attacks.choose_malicious(client_ids,
                                              config.attack_config())
    self.poisoned = (self.malicious if config.attack ==
                     attacks.LABEL_POISONING else frozenset())
    self.label_noise = {
        **experiment_lib.load_label_noise(config.label_noise_file,
                                          client_ids),
        **dict.fromkeys(self.poisoned, 1.0)}
    self.client_index = {cid: i for i, cid in enumerate(client_ids)}
    # Model variant -> its evaluator: the experiment's, and a recipe's own
    # (`add_variant`, e.g. Aequa's slimmable model at one width).
    self._evaluators: dict[str, per_client.ClientEvaluator] = {}
    self._stores: dict[str, Union[client_models.ClientModelStore,
                                  round_state.RoundStateStore]] = {}
    self._logs: list[client_models.RoundLog] = []
    self._common_held_out = None
    # Per-client training computations, by what they train (train_locally).
    self._local_training = {}

  @property
  def client_ids(self) -> Sequence[str]:
    return self.experiment.data.client_ids

  def client_datasets(self, client_ids: Sequence[str], round_num: int,
                      epochs: int, *, stream: int = 0
                      ) -> list[tf.data.Dataset]:
    """The clients' shuffled, batched training data of one round.

    Args:
      client_ids: Clients to serve, in order.
      round_num: Seeds the shuffle with the run's seed.
      epochs: Passes over each client's training split.
      stream: Separates independent shuffles of the same round (0 is the
        global model's; a recipe's other passes take others).
    """
    return sampling.client_datasets(
        self.experiment, client_ids, round_num, epochs, stream=stream,
        label_noise=self.label_noise, client_index=self.client_index)

  def training_arrays(self, client_id: str) -> tuple[np.ndarray, np.ndarray]:
    """A client's training split as it trains on it (noisy labels too)."""
    return sampling.training_arrays(self.experiment, client_id,
                                    self.label_noise, self.client_index)

  @property
  def evaluator(self) -> per_client.ClientEvaluator:
    """The evaluator of the trained architecture (variant `TRAINED`)."""
    return self.variant_evaluator(experiment_lib.TRAINED)

  def variant_evaluator(self, variant: str) -> per_client.ClientEvaluator:
    """The evaluator of a model variant (built once).

    Raises:
      KeyError: For a variant neither the experiment nor `add_variant`
        knows.
    """
    if variant not in self._evaluators:
      specs = self.experiment.model_specs
      if variant not in specs:
        raise KeyError(f'Unknown model variant {variant!r}; known:'
                       f' {", ".join([*specs, *self._evaluators])}.')
      self._evaluators[variant] = per_client.ClientEvaluator(
          specs[variant].build_keras)
    return self._evaluators[variant]

  def add_variant(self, variant: str,
                  evaluator: per_client.ClientEvaluator) -> None:
    """Registers a recipe's own model variant by its evaluator (e.g. a
    slimmable model run at one width)."""
    self._evaluators[variant] = evaluator

  def evaluate(
      self, weights: per_client.WeightsSource, split: str = 'test',
      client_ids: Optional[Sequence[str]] = None, *,
      variant: Variants = experiment_lib.TRAINED, common: bool = False,
  ) -> dict[str, ClientMetrics]:
    """Per-client metrics of global or per-client `weights`.

    Args:
      weights: One model for every client, or one per client.
      split: The clients' own split measured (each client on its own).
      client_ids: The clients (default: every client).
      variant: The model variant the weights are of: one for every
        client, or client id -> its variant (e.g. each client's width of a
        slimmable model, or its architecture). Clients are measured group
        by group.
      common: Measure every client's model on the common test set
        (`common_held_out`'s) instead of its own `split`.

    Returns:
      Client id -> metrics, in the order of `client_ids`.
    """
    data = self.experiment.data
    ids = list(data.client_ids if client_ids is None else client_ids)
    if common:
      common_test = self.common_held_out()[1]
      arrays = lambda _: common_test
    else:
      arrays = lambda cid: data.arrays(cid, split)
    groups = {}  # Variant -> its clients.
    for cid in ids:
      name = variant if isinstance(variant, str) else variant[cid]
      groups.setdefault(name, []).append(cid)
    results = {}
    for name, group in groups.items():
      evaluator = self.variant_evaluator(name)
      if common and isinstance(weights, tff.learning.models.ModelWeights):
        # One model on one data set: the same metrics for the whole group.
        measured = evaluator.evaluate_clients(weights, group[:1], arrays)
        results.update(dict.fromkeys(group, measured[group[0]]))
      else:
        results.update(evaluator.evaluate_clients(weights, group, arrays))
    return {cid: results[cid] for cid in ids}

  def final_metrics(
      self, kind: str, weights: per_client.WeightsSource, *,
      client_ids: Optional[Sequence[str]] = None,
      variant: Variants = experiment_lib.TRAINED,
  ) -> dict[str, dict[str, ClientMetrics]]:
    """A final model kind's metrics, for `Recipe.final_evaluations`.

    Returns:
      `{kind: metrics on each client's own test split}`; with the run's
      `common_test_evaluation` also `{kind + COMMON_TEST: metrics of each
      client's model on the common test set}` (the protocol of the
      fairness literature, where a client's reward is judged on the
      federation's distribution, not on its own).
    """
    options = dict(client_ids=client_ids, variant=variant)
    metrics = {kind: self.evaluate(weights, **options)}
    if self.config.common_test_evaluation:
      logging.info('Measuring the %s model(s) of %d client(s) on the common'
                   ' test set (%d examples).', kind, len(metrics[kind]),
                   len(self.common_held_out()[1][1]))
      metrics[kind + COMMON_TEST] = self.evaluate(weights, common=True,
                                                  **options)
    return metrics

  def train_locally(
      self, initial_weights: tff.learning.models.ModelWeights,
      epochs: Optional[int] = None, tag: int = 0, *,
      steps: Optional[int] = None,
      optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
  ) -> dict[str, tff.learning.models.ModelWeights]:
    """One model per client, trained alone from `initial_weights`.

    Uses the plain architecture (for a slimmable model: the full width
    without a width input; its weights have the same layout).

    Args:
      initial_weights: Where every client starts.
      epochs: Passes over each client's training split; or
      steps: Batches of it (cycling through it as needed), e.g. Per-FedAvg's
        adaptation steps.
      tag: Seeds the shuffles, as a round number would (distinct tags give
        independent shuffles).
      optimizer: Default: the client optimizer of the shared settings. The
        computation is built once per (epochs, steps, optimizer object): a
        recipe that adapts every round passes the same optimizer each time.

    Returns:
      Client id -> its trained weights, for every client.
    """
    config = self.config
    logging.info('Training every client alone for %s.',
                 f'{epochs} epoch(s)' if steps is None else f'{steps} step(s)')
    key = (epochs, steps, optimizer)
    if key not in self._local_training:
      self._local_training[key] = (
          per_client_training.build_per_client_training(
              self.experiment.plain_model_spec.model_fn,
              optimizer or experiment_lib.build_optimizer(
                  config.client_optimizer, config.client_learning_rate),
              epochs, steps=steps))
    computation = self._local_training[key]
    trained = {}
    # Groups of clients_per_round bound the memory of one call.
    step = config.clients_per_round
    for start in range(0, len(self.client_ids), step):
      group = self.client_ids[start:start + step]
      datasets = self.client_datasets(group, tag, epochs=1)
      trained.update(zip(group, remote.map_clients(
          computation, initial_weights, datasets)))
    return trained

  def standalone_epochs(self) -> int:
    """The local epochs a client gets in federated training, in expectation.

    A client takes part in clients_per_round / num_clients of the rounds and
    trains local_epochs each time; standalone training gets the same budget.
    """
    c = self.config
    return max(1, round(c.rounds * c.local_epochs * c.clients_per_round /
                        c.num_clients))

  def common_held_out(self) -> tuple[tuple[np.ndarray, np.ndarray],
                                     tuple[np.ndarray, np.ndarray]]:
    """The held-out sets every client is judged on alike: (assess, test).

    With server held-out sets (`server_held_out_examples`) the server's
    validation and test sets. Without them all clients' validation splits
    pooled (their test splits when there is none) and their test splits
    pooled.
    """
    # Built once: final evaluations ask for it per model kind.
    if self._common_held_out is None:
      data = self.experiment.data
      if data.has_server_held_out:
        self._common_held_out = (data.server_arrays('validation'),
                                 data.server_arrays('test'))
      else:
        has_validation = any(data.num_examples(c, 'validation')
                             for c in data.client_ids)
        self._common_held_out = (
            self._pooled('validation' if has_validation else 'test'),
            self._pooled('test'))
    return self._common_held_out

  def public_arrays(self) -> tuple[np.ndarray, np.ndarray]:
    """The public set (`--public_examples`): examples no client holds,
    which distillation methods share (their labels are not for training).
    """
    return self.experiment.data.public_arrays()

  def _pooled(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Every client's `split` examples, concatenated."""
    data = self.experiment.data
    arrays = [data.arrays(cid, split) for cid in data.client_ids]
    return (np.concatenate([x for x, _ in arrays]),
            np.concatenate([y for _, y in arrays]))

  def standalone_contributions(
      self, held_out: tuple[np.ndarray, np.ndarray]
  ) -> tuple[dict[str, tff.learning.models.ModelWeights], dict[str, float]]:
    """Each client's model trained alone, and its accuracy on `held_out`.

    The contribution surrogate of Aequa and IAFL: every client trains
    `standalone_epochs()` epochs from the run's initial weights (the plain
    architecture); its model is judged on common data, not on its own test
    split, so a skewed client is measured on the federation's distribution.

    Returns:
      (client id -> its standalone model, client id -> its accuracy).
    """
    logging.info('Measuring contributions as standalone accuracy on common'
                 ' held-out data (%d examples).', len(held_out[1]))
    models = self.train_locally(
        self.experiment.plain_model_spec.initial_weights(self.config.seed),
        self.standalone_epochs(), tag=0)
    on_held_out = self.variant_evaluator(
        experiment_lib.PLAIN).evaluate_clients(
        models, self.client_ids, lambda _: held_out)
    return models, {cid: m.accuracy for cid, m in on_held_out.items()}

  def benign(self, client_ids: Sequence[str]) -> list[str]:
    """`client_ids` without the malicious clients."""
    return [cid for cid in client_ids if cid not in self.malicious]

  def client_model_store(
      self, name: str, template: tff.learning.models.ModelWeights,
      part: parts.ModelPart = parts.WHOLE,
  ) -> client_models.ClientModelStore:
    """The run's store of per-client models `<output_dir>/<name>/`.

    The driver opens it at the round it resumes from, commits each round's
    writes before the round's checkpoint and prunes it after; a fallback to
    an older checkpoint needs that round's version. Declare `name` in the
    recipe's `client_state_dirs` so `--start_over` removes it.

    Args:
      name: The store's folder.
      template: Any weights of the whole model.
      part: What each client keeps (`parts.WHOLE`, or FedRep's head).
    """
    return self._add_store(name, client_models.ClientModelStore(
        self._state_dir(name), template, part))

  def round_state_store(self, name: str, initial: Any = None
                        ) -> round_state.RoundStateStore:
    """The run's store of one JSON value per round `<output_dir>/<name>/`.

    For what a recipe keeps between rounds besides models (e.g. a
    contribution tracker's state); versioned with the checkpoints like
    `client_model_store` (declare `name` in `client_state_dirs` too).
    """
    return self._add_store(name, round_state.RoundStateStore(
        self._state_dir(name), initial))

  def _state_dir(self, name: str) -> str:
    if name in self._stores:
      raise ValueError(f'A state store {name!r} is already open.')
    return os.path.join(self.config.output_dir, name)

  def _add_store(self, name, store):
    self._stores[name] = store
    return store

  def round_log(self, file_name: str, fields: Sequence[str]
                ) -> client_models.RoundLog:
    """A per-round CSV `<output_dir>/<file_name>` the driver keeps in step.

    On resume from round r the rows of later rounds are dropped (they run
    again). Declare `file_name` in the recipe's `output_files`.
    """
    log = client_models.RoundLog(
        os.path.join(self.config.output_dir, file_name), fields)
    self._logs.append(log)
    return log

  @property
  def stores(self) -> dict[str, Union[client_models.ClientModelStore,
                                      round_state.RoundStateStore]]:
    """The stores the recipe opened, by name (for the driver).

    Each has `open(round)`, `commit(round)`, `prune(round, keep)` and
    `committed_versions()`.
    """
    return dict(self._stores)

  @property
  def round_logs(self) -> list[client_models.RoundLog]:
    """The round logs the recipe opened (for the driver)."""
    return list(self._logs)
