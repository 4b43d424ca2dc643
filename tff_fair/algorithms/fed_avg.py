"""Federated Averaging whose clients may attack: the global half of Ditto.

The process is TFF's FedAvg (`tff.learning.algorithms.build_weighted_fed_avg`)
assembled from the same templates (broadcast distributor, client work, any
`tff.aggregators` factory, `build_apply_optimizer_finalizer`) with one
difference: each client's input carries an `AttackSpec` next to its data, so
robustness experiments can make chosen clients send poisoned updates
(`tff_fair.attacks`). A benign client's update is exactly FedAvg's
(`initial - trained` trainable weights, weighted by examples); the tests check
this against TFF's own process.

Client input (one per client, see `client_input`):

    <data=D*, attack=<kind=int32, scale=float32, seed=int32[2]>*>

`attack` is a data set of one element because `compose_learning_process`
takes client data as a structure of sequences.

Type signature of `next`:

    (<S@SERVER, {<data=D*, attack=A*>}@CLIENTS> -> <state=S@SERVER,
     metrics=M@SERVER>)
"""

import collections
from collections.abc import Callable
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair import attacks
from tff_fair.algorithms import client_training

ModelFn = Callable[[], tff.learning.models.VariableModel]
TrainingLoopFn = Callable[
    [tff.learning.models.VariableModel, tff.learning.optimizers.Optimizer],
    Callable[..., collections.OrderedDict]]


def client_input(
    dataset: tf.data.Dataset,
    attack: Optional[collections.OrderedDict] = None,
) -> collections.OrderedDict:
  """One client's input to `next`: its batched data and its attack spec."""
  spec = attacks.no_attack() if attack is None else attack
  return collections.OrderedDict(
      data=dataset, attack=tf.data.Dataset.from_tensors(spec))


def _first_element(dataset: tf.data.Dataset):
  """The single element of a one-element data set, inside a graph."""
  return dataset.reduce(
      tf.nest.map_structure(
          lambda s: tf.zeros(s.shape, s.dtype), dataset.element_spec),
      lambda _, element: element)


def _plain_training_loop(model, optimizer):
  loop = client_training.build_training_loop(model, optimizer)
  return lambda start, data, seed: loop(start, data)


def build_client_work(
    model_fn: ModelFn,
    optimizer: tff.learning.optimizers.Optimizer,
    *,
    training_loop_fn: Optional[TrainingLoopFn] = None,
    data_type: Optional[tff.SequenceType] = None,
) -> tff.learning.templates.ClientWorkProcess:
  """Client work: local training from the broadcast model, then the attack.

  Type signature of `next`:
    (<()@SERVER, {W}@CLIENTS, {<data=D*, attack=A*>}@CLIENTS> ->
     <state=()@SERVER, result={ClientResult}@CLIENTS, measurements=
     <train=M>@SERVER>)

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    optimizer: The local optimizer.
    training_loop_fn: `(model, optimizer) -> train(start, data, seed)` with
      the contract of `client_training.build_training_loop` plus a per-client
      seed (int32[2]) for the loop's own randomness; default: plain local
      training. Aequa's sandwich training plugs in here.
    data_type: The client data's type when it differs from the model's
      input spec (e.g. Aequa adds the width inside the loop).
  """
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  with tf.Graph().as_default():
    probe = model_fn()
    metrics_type = tff.types.tensorflow_to_type(
        tf.nest.map_structure(
            lambda v: tf.TensorSpec.from_tensor(tf.convert_to_tensor(v)),
            probe.report_local_unfinalized_metrics()))
    metric_finalizers = probe.metric_finalizers()
  input_type = collections.OrderedDict(
      data=data_type or client_training.data_type_of(model_fn),
      attack=tff.SequenceType(tff.types.tensorflow_to_type(
          attacks.attack_spec_type())))

  @tff.tensorflow.computation(weights_type, input_type)
  def client_update(initial_weights, client_data):
    spec = _first_element(client_data['attack'])
    loop = (training_loop_fn or _plain_training_loop)(model_fn(), optimizer)
    trained = loop(initial_weights, client_data['data'], spec['seed'])
    update = tf.nest.map_structure(
        tf.subtract, initial_weights.trainable, trained['weights'].trainable)
    update = attacks.apply_update_attack(update, spec)
    # As TFF's FedAvg: a non-finite update is zeroed and gets no weight.
    update, non_finite = _zero_non_finite(update)
    weight = tf.cond(non_finite,
                     lambda: tf.constant(0.0),
                     lambda: tf.cast(trained['num_examples'], tf.float32))
    return (tff.learning.templates.ClientResult(
        update=update, update_weight=weight), trained['metrics'])

  @tff.federated_computation()
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  metrics_aggregation = tff.learning.metrics.sum_then_finalize(
      metric_finalizers, metrics_type)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(input_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    result, local_metrics = tff.federated_map(
        client_update, (weights, client_data))
    measurements = tff.federated_zip(collections.OrderedDict(
        train=metrics_aggregation(local_metrics)))
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
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    *,
    training_loop_fn: Optional[TrainingLoopFn] = None,
    data_type: Optional[tff.SequenceType] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedAvg with per-client attack inputs.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer: Optimizer of the clients' local training.
    server_optimizer: Applied to the aggregated update (as a gradient).
    model_aggregator: A weighted or unweighted `tff.aggregators` factory
      (default `tff.aggregators.MeanFactory()`), e.g.
      `tff.learning.robust_aggregator()`, `tff.learning.dp_aggregator(...)`
      (unweighted: clients count equally) or
      `tff.learning.compression_aggregator()`.
    training_loop_fn: See `build_client_work`.
    data_type: See `build_client_work`.

  Returns:
    A `tff.learning.templates.LearningProcess`; see the module docstring for
    its types.
  """
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  aggregator_factory = model_aggregator or tff.aggregators.MeanFactory()
  if isinstance(aggregator_factory,
                tff.aggregators.UnweightedAggregationFactory):
    aggregator_factory = tff.aggregators.as_weighted_aggregator(
        aggregator_factory)

  @tff.tensorflow.computation
  def initial_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return tff.learning.templates.compose_learning_process(
      initial_weights_fn,
      tff.learning.templates.build_broadcast_process(weights_type),
      build_client_work(model_fn, client_optimizer,
                        training_loop_fn=training_loop_fn,
                        data_type=data_type),
      aggregator_factory.create(weights_type.trainable,
                                tff.TensorType(np.float32)),
      tff.learning.templates.build_apply_optimizer_finalizer(
          server_optimizer, weights_type),
  )
