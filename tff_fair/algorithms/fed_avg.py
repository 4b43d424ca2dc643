"""Federated Averaging, optionally with per-client context (attacks, seeds).

The process is TFF's FedAvg (`tff.learning.algorithms.build_weighted_fed_avg`)
assembled from the same templates (a distributor, client work, any
`tff.aggregators` factory, `build_apply_optimizer_finalizer`) and takes the
same arguments. By default it is a drop-in replacement: each client's input
is its batched data set, as for every `tff.learning` process, so it runs in
`tff.simulation.run_training_process`, `tff.learning.programs.train_model`
or a loop of your own:

    next: (<S@SERVER, {D*}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER>)

A benign client's update is exactly FedAvg's (`initial - trained` trainable
weights, weighted by examples); the tests check this against TFF's own
process.

With `client_context=True` every client's input also carries an attack spec
(`update_attacks`), so robustness experiments can make chosen clients send
poisoned updates, and its `seed` seeds the client's own randomness (Aequa's
widths):

    next: (<S@SERVER, {<data=D*, attack=A*>}@CLIENTS> ->
           <state=S@SERVER, metrics=M@SERVER>)
    A = <kind=int32, scale=float32, seed=int32[2]>

`attack` is a data set of one element (`client_input` builds it) because
`compose_learning_process` takes client data as a structure of sequences.
The option changes the client input only: the state, and so checkpoints, are
the same with and without it. `tff_fair.training` opts in.
"""

import collections
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import training_loop
from tff_fair.algorithms import update_attacks

ModelFn = Callable[[], tff.learning.models.VariableModel]
TrainingLoopFn = Callable[
    [tff.learning.models.VariableModel, tff.learning.optimizers.Optimizer],
    Callable[..., collections.OrderedDict]]
ClientWeighting = tff.learning.ClientWeighting
MetricsAggregator = Optional[tff.learning.metrics.MetricsAggregatorType]


def default_server_optimizer() -> tff.learning.optimizers.Optimizer:
  """TFF's default server optimizer: SGD with learning rate 1.0."""
  return tff.learning.optimizers.build_sgdm(learning_rate=1.0)


def client_input(
    dataset: tf.data.Dataset,
    attack: Optional[collections.OrderedDict] = None,
) -> collections.OrderedDict:
  """One client's input to `next` of a process built with `client_context`.

  Args:
    dataset: The client's batched data set.
    attack: Its `update_attacks.attack_spec` (default: `no_attack()`,
      whose seed is 0).

  Returns:
    `OrderedDict(data=dataset, attack=<one-element data set of the spec>)`.
  """
  spec = update_attacks.no_attack() if attack is None else attack
  return collections.OrderedDict(
      data=dataset, attack=tf.data.Dataset.from_tensors(spec))


def first_element(dataset: tf.data.Dataset):
  """The single element of a one-element data set, inside a graph."""
  return dataset.reduce(
      tf.nest.map_structure(
          lambda s: tf.zeros(s.shape, s.dtype), dataset.element_spec),
      lambda _, element: element)


def _fingerprint(structure) -> tf.Tensor:
  """uint8[1, 8]: a farmhash64 fingerprint of every tensor's contents."""
  parts = [tf.fingerprint(tf.reshape(t, [1, -1]))
           for t in tf.nest.flatten(structure)]
  return tf.fingerprint(tf.concat(parts, axis=1))


def derived_seed(weights, data: tf.data.Dataset) -> tf.Tensor:
  """A client's seed (int32[2]) without client context, inside a graph.

  A fingerprint of the broadcast model's weights (new every round) and of
  the client's first batch (differs between clients with different data):
  the same state and the same data in the same order give the same seed,
  so a run with deterministic data reproduces. Clients whose first batches
  are identical share their seed within a round.

  Args:
    weights: The client's initial `ModelWeights` (or any structure).
    data: The client's batched data set; its first batch is read.

  Returns:
    int32[2].
  """
  first_batch = data.take(1).reduce(
      tf.zeros([1, 8], tf.uint8), lambda _, batch: _fingerprint(batch))
  combined = tf.fingerprint(tf.concat(
      [_fingerprint(weights), first_batch], axis=1))
  return tf.bitcast(tf.reshape(combined, [2, 4]), tf.int32)


def client_input_type(model_fn: ModelFn, client_context: bool,
                      data_type: Optional[tff.Type] = None) -> Any:
  """A client's input: its data (`data_type`, default the model's input
  spec), or `context_type` of it under `client_context`."""
  data_type = data_type or training_loop.data_type_of(model_fn)
  return context_type(data_type) if client_context else data_type


def context_type(data_type: tff.Type, **extra) -> collections.OrderedDict:
  """The client input type under client context: `<data, attack, **extra>`.

  Args:
    data_type: The client data's `tff.SequenceType`.
    **extra: Further per-client fields and their TFF types (e.g. Aequa's
      `max_width`), after `data` and `attack`.
  """
  return collections.OrderedDict(
      data=data_type,
      attack=tff.SequenceType(tff.types.tensorflow_to_type(
          update_attacks.attack_spec_type())),
      **extra)


def read_client_input(client_data, client_context: bool, weights,
                      derive_seed: bool = True):
  """`(data, attack spec or None, seed)` of a client's input, in a graph.

  Args:
    client_data: The client's input: its data set, or under
      `client_context` a structure with `data` and `attack`.
    client_context: Whether `client_data` carries an attack spec.
    weights: The weights the client starts from (for `derived_seed`).
    derive_seed: Without context, derive the seed (`derived_seed`) rather
      than use zeros (a loop that draws nothing needs no seed).
  """
  if client_context:
    spec = first_element(client_data['attack'])
    return client_data['data'], spec, spec['seed']
  seed = (derived_seed(weights, client_data) if derive_seed
          else tf.zeros([2], tf.int32))
  return client_data, None, seed


def update_and_weight(initial_weights, trained, spec,
                      client_weighting: ClientWeighting):
  """A client's update (`initial - trained`, attacked) and its weight.

  As TFF's FedAvg, a non-finite update is zeroed and gets weight 0.

  Args:
    initial_weights: The `ModelWeights` training started from.
    trained: A training loop's result (`weights`, `num_examples`).
    spec: The client's attack spec, or None (no attack).
    client_weighting: `NUM_EXAMPLES` (examples seen) or `UNIFORM` (1).

  Returns:
    `(update, weight)`: the trainable weights' structure and a float32.
  """
  update = tf.nest.map_structure(
      tf.subtract, initial_weights.trainable, trained['weights'].trainable)
  if spec is not None:
    update = update_attacks.apply_update_attack(update, spec)
  update, non_finite = _zero_non_finite(update)
  if client_weighting is ClientWeighting.NUM_EXAMPLES:
    weight = tf.cast(trained['num_examples'], tf.float32)
  else:
    weight = tf.constant(1.0)
  weight = tf.cond(non_finite, lambda: tf.constant(0.0), lambda: weight)
  return update, weight


def check_client_weighting(client_weighting) -> None:
  """Raises `TypeError` unless `client_weighting` is a `ClientWeighting`."""
  if not isinstance(client_weighting, ClientWeighting):
    raise TypeError('client_weighting must be a tff.learning.ClientWeighting,'
                    f' got {client_weighting!r}.')


def metrics_aggregation(
    model_fn: ModelFn, metrics_aggregator: MetricsAggregator = None
) -> tff.Computation:
  """The federated aggregation of the model's unfinalized client metrics.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    metrics_aggregator: Default `tff.learning.metrics.sum_then_finalize`.
  """
  with tf.Graph().as_default():
    probe = model_fn()
    metrics_type = tff.types.tensorflow_to_type(
        tf.nest.map_structure(
            lambda v: tf.TensorSpec.from_tensor(tf.convert_to_tensor(v)),
            probe.report_local_unfinalized_metrics()))
    metric_finalizers = probe.metric_finalizers()
  return (metrics_aggregator or tff.learning.metrics.sum_then_finalize)(
      metric_finalizers, metrics_type)


def _plain_training_loop(model, optimizer):
  loop = training_loop.build_training_loop(model, optimizer)
  return lambda start, data, seed: loop(start, data)


def build_client_work(
    model_fn: ModelFn,
    optimizer: tff.learning.optimizers.Optimizer,
    *,
    client_weighting: ClientWeighting = ClientWeighting.NUM_EXAMPLES,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    client_context: bool = False,
    training_loop_fn: Optional[TrainingLoopFn] = None,
    data_type: Optional[tff.SequenceType] = None,
) -> tff.learning.templates.ClientWorkProcess:
  """Client work: local training from the broadcast model (then the attack).

  Type signature of `next`:
    (<()@SERVER, {W}@CLIENTS, {D*}@CLIENTS> -> <state=()@SERVER,
     result={ClientResult}@CLIENTS, measurements=<train=M>@SERVER>)

  with `{<data=D*, attack=A*>}@CLIENTS` as client data under
  `client_context`.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    optimizer: The local optimizer.
    client_weighting: `tff.learning.ClientWeighting.NUM_EXAMPLES` (default)
      or `UNIFORM`. A client whose update is not finite gets weight 0 and a
      zero update, as in TFF.
    metrics_aggregator: As in `tff.learning.algorithms.
      build_weighted_fed_avg`; default `tff.learning.metrics.
      sum_then_finalize`.
    client_context: Client input `<data=D*, attack=A*>` (see the module
      docstring) instead of `D*`.
    training_loop_fn: `(model, optimizer) -> train(start, data, seed)` with
      the contract of `training_loop.build_training_loop` plus a per-client
      seed (int32[2]) for the loop's own randomness: the attack spec's seed
      under `client_context`, else `derived_seed`. Default: plain local
      training. Aequa's sandwich training plugs in here.
    data_type: The client data's type when it differs from the model's
      input spec (e.g. Aequa adds the width inside the loop).
  """
  check_client_weighting(client_weighting)
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  input_type = client_input_type(model_fn, client_context, data_type)

  @tff.tensorflow.computation(weights_type, input_type)
  def client_update(initial_weights, client_data):
    data, spec, seed = read_client_input(
        client_data, client_context, initial_weights,
        derive_seed=training_loop_fn is not None)
    loop = (training_loop_fn or _plain_training_loop)(model_fn(), optimizer)
    trained = loop(initial_weights, data, seed)
    update, weight = update_and_weight(initial_weights, trained, spec,
                                       client_weighting)
    return (tff.learning.templates.ClientResult(
        update=update, update_weight=weight), trained['metrics'])

  @tff.federated_computation()
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  aggregate_metrics = metrics_aggregation(model_fn, metrics_aggregator)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(input_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    result, local_metrics = tff.federated_map(
        client_update, (weights, client_data))
    measurements = tff.federated_zip(collections.OrderedDict(
        train=aggregate_metrics(local_metrics)))
    return tff.templates.MeasuredProcessOutput(state, result, measurements)

  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)


def _zero_non_finite(structure):
  """Zeros every tensor if any is non-finite; returns (structure, flag)."""
  tensors = tf.nest.flatten(structure)
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t))
                          for t in tensors])
  zeroed = [tf.where(finite, t, tf.zeros_like(t)) for t in tensors]
  return tf.nest.pack_sequence_as(structure, zeroed), tf.logical_not(finite)


def build_fed_avg(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    client_weighting: ClientWeighting = ClientWeighting.NUM_EXAMPLES,
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess] = None,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    client_context: bool = False,
    training_loop_fn: Optional[TrainingLoopFn] = None,
    data_type: Optional[tff.SequenceType] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedAvg, as `tff.learning.algorithms.build_weighted_fed_avg`.

  The arguments up to `metrics_aggregator` are TFF's, with TFF's defaults
  (TFF's `loop_implementation` has no counterpart: the local loop is a
  `tf.data.Dataset.reduce`, TFF's default; `model_fn` must return a
  `VariableModel`, not a `FunctionalModel`).

  Type signatures:

      initialize: ( -> S@SERVER)
      next:       (<S@SERVER, {D*}@CLIENTS> ->
                   <state=S@SERVER, metrics=M@SERVER>)

  and with `client_context=True`:

      next:       (<S@SERVER, {<data=D*, attack=A*>}@CLIENTS> ->
                   <state=S@SERVER, metrics=M@SERVER>)

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer_fn: A `tff.learning.optimizers.Optimizer` for the
      clients' local training.
    server_optimizer_fn: Applied to the aggregated update (as a gradient);
      default `tff.learning.optimizers.build_sgdm(learning_rate=1.0)`.
    client_weighting: `tff.learning.ClientWeighting.NUM_EXAMPLES` (default)
      or `UNIFORM`.
    model_distributor: A `tff.learning.templates.DistributionProcess`;
      default `tff.learning.templates.build_broadcast_process`.
    model_aggregator: A weighted or unweighted `tff.aggregators` factory
      (default `tff.aggregators.MeanFactory()`), e.g.
      `tff.learning.robust_aggregator()`, `tff.learning.dp_aggregator(...)`
      (unweighted: clients count equally) or
      `tff.learning.compression_aggregator()`.
    metrics_aggregator: Aggregates the clients' unfinalized metrics; default
      `tff.learning.metrics.sum_then_finalize`.
    client_context: Opt in to per-client context: each client's input is
      `client_input(dataset, attack_spec)`, whose spec can make the client
      attack and whose seed seeds its randomness. Default: plain data sets.
    training_loop_fn: See `build_client_work`.
    data_type: See `build_client_work`.

  Returns:
    A `tff.learning.templates.LearningProcess`. Its state does not depend on
    `client_context`.
  """
  return tff.learning.templates.compose_learning_process(*build_fed_avg_parts(
      model_fn, client_optimizer_fn, server_optimizer_fn,
      client_weighting=client_weighting,
      model_distributor=model_distributor,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator,
      client_context=client_context,
      training_loop_fn=training_loop_fn,
      data_type=data_type))


def build_update_aggregator(
    model_aggregator: Optional[tff.aggregators.AggregationFactory],
    weights_type: tff.Type,
) -> tff.templates.AggregationProcess:
  """The aggregation of weighted model updates, as TFF's FedAvg builds it.

  `model_aggregator` (default `MeanFactory()`) over the trainable weights;
  an unweighted factory (e.g. `tff.learning.dp_aggregator`) ignores the
  weights (`tff.aggregators.as_weighted_aggregator`).
  """
  factory = model_aggregator or tff.aggregators.MeanFactory()
  if isinstance(factory, tff.aggregators.UnweightedAggregationFactory):
    factory = tff.aggregators.as_weighted_aggregator(factory)
  return factory.create(weights_type.trainable, tff.TensorType(np.float32))


class FedAvgParts(NamedTuple):
  """`build_fed_avg`'s components, in `compose_learning_process`'s order."""
  initial_model_weights_fn: tff.Computation
  model_weights_distributor: tff.learning.templates.DistributionProcess
  client_work: tff.learning.templates.ClientWorkProcess
  model_update_aggregator: tff.templates.AggregationProcess
  model_finalizer: tff.learning.templates.FinalizerProcess


def build_fed_avg_parts(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    client_weighting: ClientWeighting = ClientWeighting.NUM_EXAMPLES,
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess] = None,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    client_context: bool = False,
    training_loop_fn: Optional[TrainingLoopFn] = None,
    data_type: Optional[tff.SequenceType] = None,
) -> FedAvgParts:
  """The components `build_fed_avg` composes (same arguments).

  For a process that runs FedAvg's round with more client work beside it
  (Ditto's `personalize_and_next`) and must keep FedAvg's state exactly.
  """
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  if server_optimizer_fn is None:
    server_optimizer_fn = default_server_optimizer()

  @tff.tensorflow.computation
  def initial_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return FedAvgParts(
      initial_weights_fn,
      model_distributor or tff.learning.templates.build_broadcast_process(
          weights_type),
      build_client_work(model_fn, client_optimizer_fn,
                        client_weighting=client_weighting,
                        metrics_aggregator=metrics_aggregator,
                        client_context=client_context,
                        training_loop_fn=training_loop_fn,
                        data_type=data_type),
      build_update_aggregator(model_aggregator, weights_type),
      tff.learning.templates.build_apply_optimizer_finalizer(
          server_optimizer_fn, weights_type),
  )
