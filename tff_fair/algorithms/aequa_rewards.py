"""Training-time Aequa: each client trains, sends and gets only its sub-network.

Aequa (Tastan et al., ICML 2025) also rewards clients during training:
client i, whose contribution so far earned it the maximum width p_i, trains
only widths in [p_min, p_i], and only its width-p_i sub-network travels.
Contributions are measured between rounds in Python
(`tff_fair.fairness.contribution`); this module is the federated round.

* Local training: Aequa's sandwich loop (`aequa.build_sandwich_loop_fn`)
  with p_i on top: every step trains width p_i and `widths_per_step` widths
  drawn from [p_min, p_i), seeded as in `aequa`. No draw exceeds p_i, so no
  coordinate outside the client's sub-network moves.
* What a client sends: its update on its sub-network only. With m_i the
  0/1 mask of the width-p_i sub-network (`slimmable.variable_masks`), w_i
  its weight (examples) and u_i its update, it sends w_i * m_i * u_i and
  w_i * m_i.
* Masked aggregation (as HeteroFL): the server sums both and divides
  coordinate by coordinate, so each parameter moves by the weighted mean of
  the updates of the clients whose sub-network contains it. A parameter no
  participant trained keeps its value exactly, whatever the server
  optimizer (its old value is restored after the optimizer step, which a
  momentum would otherwise still move). With every p_i = 1 every weight is
  all ones and this is FedAvg's weighted mean: the process then equals
  `aequa.build_aequa` (p_max = 1) from the same seeds.
* p_max < 1: no client trains beyond p_max (`build_aequa` instead trains the
  full width in every step); the parameters outside width p_max keep their
  initial values.

Client context. By default clients give plain data sets and all train with
p_i = p_max (seeds derived as in `aequa`). With `client_context=True` each
client's input is `client_input(dataset, max_width, attack)`:
`<data=D*, attack=A*, max_width=float32>`, the attack spec of
`fed_avg.client_input` (attacks, seed) plus the client's p_i, a plain
scalar (only the attack spec is a one-element data set, for
`compose_learning_process`'s sake in `fed_avg`). A p_i outside
[p_min, p_max] fails the round.

Communication. TFF types are static, so the simulation moves full-width
tensors; what a deployment moves is each client's sub-network: it receives
the sub-network's weights and sends its update on them, 4 bytes (float32)
per parameter: `slimmable.active_parameter_count(model, p_i) * 4` both
ways (non-trainable weights, none in tff_fair's slimmable models, would
count as received only). Both shrink with p_i. Per client they are among
`next_with_client_outputs`'s client values; `next`'s metrics carry the
round's totals.

Contribution tracking. The tracker compares clients on the common
minimum-width (p_min) sub-network, which every client trains. Computing
CGSV's cosine needs every client's update there, which a server aggregate
cannot give and TFF's `LearningProcess.next` cannot return (no
CLIENTS-placed results), so the process is a
`client_outputs.ProcessWithClientOutputs`: `next` is a plain
`LearningProcess` round, `next_with_client_outputs` the same round that
also returns each client's `min_width_update` (its update at the
coordinates of width p_min, flattened in variable order) and `weight`; the
metrics carry the weighted aggregate on the same coordinates
(`min_width_aggregate`). In Python:

    output = process.next_with_client_outputs(state, inputs)
    scores = contribution.cosine_to_aggregate(
        {cid: c['min_width_update'] for cid, c in zip(ids, output.clients)})

Type signatures (`client_outputs`):

    initialize: ( -> S@SERVER)
    next: (<S@SERVER, {C}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER>)
    next_with_client_outputs: (<S@SERVER, {C}@CLIENTS> ->
        <state=S@SERVER, metrics=M@SERVER, clients={O}@CLIENTS>)
    C = D* (plain) or <data=D*, attack=A*, max_width=float32> (context)
    O = <min_width_update=float32[d_min], weight=float32,
         bytes_received=int64, bytes_sent=int64>
    M = <distributor=(), client_work=<train=T, bytes_received=int64,
         bytes_sent=int64>, aggregator=<min_width_aggregate=float32[d_min]>,
         finalizer=F>

The parts are `tff.learning`'s (`client_outputs.compose`): a broadcast,
the sandwich client work, the masked mean as the aggregator (each client
sends its weighted update and weights restricted to its sub-network), and
the server optimizer as the finalizer, after which a parameter no client
trained keeps its value.
"""

import collections
from collections.abc import Callable
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import aequa
from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import fed_avg
from tff_fair.fairness import contribution
from tff_fair.models import slimmable

# Bytes of one float32 parameter.
BYTES_PER_PARAMETER = 4


def client_input(
    dataset: tf.data.Dataset, max_width: float,
    attack: Optional[collections.OrderedDict] = None,
) -> collections.OrderedDict:
  """One client's input to `next` of a process built with `client_context`.

  Args:
    dataset: The client's batched data set (without widths).
    max_width: The client's p_i, in [p_min, p_max] of the process.
    attack: Its `update_attacks.attack_spec` (default: none, seed 0).

  Returns:
    `OrderedDict(data, attack, max_width)`.
  """
  if not 0.0 < max_width <= 1.0:
    raise ValueError(f'max_width must be in (0, 1], got {max_width}.')
  return collections.OrderedDict(
      **fed_avg.client_input(dataset, attack),
      max_width=np.float32(max_width))


def subnetwork_bytes(keras_model: tf.keras.Model, width: float) -> int:
  """Bytes a client of maximum width `width` receives (and sends) a round."""
  return slimmable.active_parameter_count(keras_model,
                                          width) * BYTES_PER_PARAMETER


def min_width_size(keras_model: tf.keras.Model, p_min: float) -> int:
  """Length of a client's `min_width_update`: trainables of width p_min."""
  return int(sum(np.sum(m.numpy())
                 for m in slimmable.variable_masks(keras_model, p_min)))


def _check_same_weights(keras_model: tf.keras.Model, weights_type) -> None:
  """`keras_model_fn` must build `model_fn`'s architecture (masks align)."""
  shapes = [tuple(v.shape) for v in keras_model.trainable_variables]
  expected = [tuple(t.shape) for t in weights_type.trainable]
  if shapes != expected:
    raise ValueError(
        'keras_model_fn builds another architecture than model_fn: trainable'
        f' shapes {shapes} vs {expected}.')


def _checked_max_width(max_width, p_min: float, p_max: float) -> tf.Tensor:
  message = (f'A client max_width must lie in [p_min, p_max] = [{p_min},'
             f' {p_max}].')
  with tf.control_dependencies([
      tf.debugging.assert_greater_equal(max_width, tf.constant(p_min),
                                        message=message),
      tf.debugging.assert_less_equal(max_width, tf.constant(p_max),
                                     message=message),
  ]):
    return tf.identity(max_width)


def build_aequa_rewards(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    keras_model_fn: Callable[[], tf.keras.Model],
    p_min: float = 0.1,
    p_max: float = 1.0,
    widths_per_step: int = 1,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    metrics_aggregator: fed_avg.MetricsAggregator = None,
    client_context: bool = False,
) -> client_outputs.ProcessWithClientOutputs:
  """Builds training-time Aequa (see the module docstring).

  `next` and `next_with_client_outputs` take `{C}@CLIENTS` with C = D*
  by default and `<data=D*, attack=A*, max_width=float32>` under
  `client_context`; their types are in the module docstring.

  Args:
    model_fn: Returns a fresh `VariableModel` of a slimmable Keras model
      whose input spec carries the width (`model_fns.build_model_spec`).
    client_optimizer_fn: Local optimizer.
    server_optimizer_fn: Applied to the masked mean update; default SGD
      with learning rate 1.0 (TFF's default).
    keras_model_fn: No-arg callable returning the slimmable Keras model
      `model_fn` wraps (e.g. `lambda: spec.build_keras(None)`); called once,
      here: its layers define each width's sub-network (the masks).
    p_min: Smallest width; every client trains it.
    p_max: Largest width a client may have (1.0: the full model).
    widths_per_step: Widths sampled per step besides the client's p_i.
    client_weighting: As in `fed_avg.build_fed_avg`.
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    client_context: Per-client p_i and attack specs (`client_input`);
      default plain data sets, every client at p_max.

  Returns:
    A `client_outputs.ProcessWithClientOutputs`.

  Raises:
    ValueError: For widths outside (0, 1], p_min > p_max, widths_per_step
      < 0, or a `keras_model_fn` of another architecture.
  """
  contribution.check_width_range(p_min, p_max)
  if widths_per_step < 0:
    raise ValueError(f'widths_per_step must be >= 0, got {widths_per_step}.')
  fed_avg.check_client_weighting(client_weighting)
  server_optimizer = (server_optimizer_fn
                      or fed_avg.default_server_optimizer())
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  # Built once, eagerly: the masks read only its layers' sizes, never the
  # values of its variables, so the computations below can use it.
  mask_model = keras_model_fn()
  _check_same_weights(mask_model, weights_type)
  d_min = min_width_size(mask_model, p_min)
  non_trainable_size = sum(int(np.prod(t.shape))
                           for t in weights_type.non_trainable)
  data_type = aequa.plain_data_type(model_fn)
  if client_context:
    input_type = fed_avg.context_type(
        data_type, max_width=tff.TensorType(np.float32))
  else:
    input_type = data_type
  loop_fn = aequa.build_sandwich_loop_fn(p_min, p_max, widths_per_step)

  @tff.tensorflow.computation(weights_type, input_type)
  def client_update(initial_weights, client_data):
    data, spec, seed = fed_avg.read_client_input(
        client_data, client_context, initial_weights)
    if client_context:
      max_width = _checked_max_width(client_data['max_width'], p_min, p_max)
    else:
      max_width = float(p_max)  # Static shapes: see `slimmable.with_width`.
    trained = loop_fn(model_fn(), client_optimizer_fn)(
        initial_weights, data, seed, max_width)
    update, weight = fed_avg.update_and_weight(initial_weights, trained,
                                               spec, client_weighting)
    updates = tf.nest.flatten(update)
    masks = slimmable.variable_masks(mask_model, max_width)
    min_masks = slimmable.variable_masks(mask_model, p_min)
    sums = collections.OrderedDict(
        update=tf.nest.pack_sequence_as(
            update, [weight * m * u for m, u in zip(masks, updates)]),
        weight=tf.nest.pack_sequence_as(update, [weight * m for m in masks]))
    parameters = tf.add_n([tf.reduce_sum(tf.cast(m, tf.int64))
                           for m in masks])
    report = collections.OrderedDict(
        min_width_update=tf.ensure_shape(tf.concat(
            [tf.boolean_mask(u, m > 0) for u, m in zip(updates, min_masks)],
            axis=0), [d_min]),
        weight=weight,
        bytes_received=(parameters + non_trainable_size) * BYTES_PER_PARAMETER,
        bytes_sent=parameters * BYTES_PER_PARAMETER)
    # Each parameter's weights travel with its update (the masked mean);
    # the update weight is the client's, for aggregators that read it.
    return (tff.learning.templates.ClientResult(update=sums,
                                                update_weight=weight),
            trained['metrics'], report)

  sums_type = client_update.type_signature.result[0].update

  @tff.tensorflow.computation(sums_type)
  def masked_mean(sums):
    update = tf.nest.map_structure(tf.math.divide_no_nan, sums['update'],
                                   sums['weight'])
    trained = tf.nest.map_structure(lambda w: w > 0, sums['weight'])
    min_masks = slimmable.variable_masks(mask_model, p_min)
    min_width_aggregate = tf.concat(
        [tf.boolean_mask(u, m > 0)
         for u, m in zip(tf.nest.flatten(update), min_masks)], axis=0)
    return (collections.OrderedDict(update=update, trained=trained),
            tf.ensure_shape(min_width_aggregate, [d_min]))

  @tff.tensorflow.computation(weights_type, weights_type,
                              masked_mean.type_signature.result[0].trained)
  def keep_untrained(old, new, trained):
    return tff.learning.models.ModelWeights(
        trainable=tf.nest.map_structure(tf.where, trained, new.trainable,
                                        old.trainable),
        non_trainable=new.non_trainable)

  @tff.federated_computation()
  def no_state():
    return tff.federated_value((), tff.SERVER)

  @tff.federated_computation(
      no_state.type_signature.result,
      tff.FederatedType(sums_type, tff.CLIENTS),
      tff.FederatedType(np.float32, tff.CLIENTS))
  def masked_mean_next(state, sums, weight):
    del weight  # Each parameter's weights are in `sums`.
    aggregate, min_width_aggregate = tff.federated_map(
        masked_mean, tff.federated_sum(sums))
    return tff.templates.MeasuredProcessOutput(
        state, aggregate, tff.federated_zip(collections.OrderedDict(
            min_width_aggregate=min_width_aggregate)))

  optimizer_finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, weights_type)

  @tff.federated_computation(
      optimizer_finalizer.next.type_signature.parameter[0],
      tff.FederatedType(weights_type, tff.SERVER),
      masked_mean_next.type_signature.result.result)
  def finalizer_next(state, weights, aggregate):
    # The server optimizer, then every parameter no client trained keeps its
    # value (a zero mean update would still move it under momentum or Adam).
    applied = optimizer_finalizer.next(state, weights, aggregate.update)
    return tff.templates.MeasuredProcessOutput(
        applied.state,
        tff.federated_map(keep_untrained,
                          (weights, applied.result, aggregate.trained)),
        applied.measurements)

  return client_outputs.compose(
      client_outputs.initial_weights_fn(model_fn),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_outputs.build_client_work(
          client_update,
          fed_avg.metrics_aggregation(model_fn, metrics_aggregator),
          summed_outputs=('bytes_received', 'bytes_sent')),
      tff.templates.AggregationProcess(no_state, masked_mean_next),
      tff.learning.templates.FinalizerProcess(
          optimizer_finalizer.initialize, finalizer_next))

