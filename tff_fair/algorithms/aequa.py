"""Aequa: one slimmable global model, a width per client by contribution.

Tastan et al. (ICML 2025) train a slimmable network federatedly and then
reward each client with a sub-network whose width (hence accuracy) follows
its contribution. No public implementation exists; every choice the paper
leaves open is documented where it is made:

* Training (this module). FedAvg whose local step is "sandwich"-like: in
  every minibatch step a client trains the full width and `widths_per_step`
  widths drawn uniformly from [p_min, p_max), summing the losses (one
  gradient step on the sum). Widths are drawn with a stateless generator
  (`sample_widths`) whose seed folds the step index into the client's seed
  for the round, so no two (client, step) pairs share their draws. Every
  client trains the full width, so every coordinate is trained by every
  client and plain (weighted) averaging applies; any `tff.aggregators`
  factory works.
* Width-accuracy curve, allocation and metrics: `tff_fair.fairness` and the
  training driver (the allocation is plain numpy, outside TFF).

Training metrics (loss, accuracy) are those of the full-width pass; the
sampled widths' losses enter the gradient only, so nothing is counted twice.

Client seeds. By default client data are plain batches, as for any
`tff.learning` process, and a client's seed is derived inside the
computation (`fed_avg.derived_seed`): a fingerprint of the broadcast model
and of the client's first batch. Runs are reproducible (same initial state,
same data in the same order: same widths), draws change every round (the
model changes), and clients with different data draw differently; clients
whose first batches are identical draw the same widths in a round. With
`client_context=True` each client's input carries an attack spec
(`update_attacks`) whose `seed` the driver chooses per client and round
(`tff_fair.training` does), so draws are independent of the data.

Type signatures (the width is added inside the loop, never sent):

    initialize: ( -> S@SERVER)
    next:       (<S@SERVER, {D*}@CLIENTS> ->
                 <state=S@SERVER, metrics=M@SERVER>)

and with `client_context=True`:

    next:       (<S@SERVER, {<data=D*, attack=A*>}@CLIENTS> ->
                 <state=S@SERVER, metrics=M@SERVER>)
"""

import collections
from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import update_attacks
from tff_fair.fairness import contribution
from tff_fair.models import model_fns
from tff_fair.models import slimmable


def plain_data_type(model_fn) -> tff.SequenceType:
  """The client data type: the model's input spec without the width."""
  with tf.Graph().as_default():
    spec = model_fn().input_spec
  features, _ = slimmable.split_inputs(spec['x'])
  return tff.SequenceType(tff.types.tensorflow_to_type(
      collections.OrderedDict(x=features, y=spec['y'])))


def _check_slimmable(model_fn) -> None:
  """Refuses a model whose input has no width, before TFF traces it.

  Otherwise the first traced step fails inside Keras with an error about
  missing `features`/`width` inputs, far from the cause.
  """
  with tf.Graph().as_default():
    spec = model_fn().input_spec
  if slimmable.split_inputs(spec['x'])[1] is None:
    raise ValueError(
        'build_aequa needs a slimmable model, whose input carries a width;'
        " model_fn's input has none: build it with a slimmable spec, e.g."
        " tff_fair.models.model_fns.build_model_spec('slimmable_lenet',"
        ' ...).model_fn.')


def sample_widths(seed, step, p_min: float, p_max, count: int) -> tf.Tensor:
  """The widths one local step trains besides the full width.

  Args:
    seed: The client's seed (int32[2]: round seed and client index from the
      client's attack spec, or `fed_avg.derived_seed`).
    step: The local step's index (int32 scalar).
    p_min: Smallest width.
    p_max: Upper end of the range (drawn widths are < p_max unless p_min ==
      p_max): a number, or a float32 scalar tensor (a client's own maximum
      width in training-time Aequa).
    count: Number of widths.

  Returns:
    float32[count], uniform in [p_min, p_max), drawn with a stateless
    generator seeded by `update_attacks.client_seed` (stream
    `WIDTH_STREAM`, draw `step`).
  """
  return tf.random.stateless_uniform(
      [count],
      seed=update_attacks.client_seed(seed, update_attacks.WIDTH_STREAM, step),
      minval=p_min, maxval=p_max)


def build_sandwich_loop_fn(
    p_min: float, p_max: float, widths_per_step: int
) -> fed_avg.TrainingLoopFn:
  """Aequa's local training loop, in `fed_avg.build_client_work`'s form.

  The loop is `train(start, data, seed, max_width=None)`. By default each
  step trains the full width and widths drawn from [p_min, p_max). With a
  `max_width` (a float32 scalar, training-time Aequa's per-client p_i, or a
  Python float) it trains `max_width` and widths drawn from
  [p_min, max_width) instead, so no coordinate outside the width-`max_width`
  sub-network moves.
  """

  def loop_fn(model: tff.learning.models.VariableModel,
              optimizer: tff.learning.optimizers.Optimizer):
    weights = tff.learning.models.ModelWeights.from_model(model)
    trainable = tuple(tf.nest.flatten(weights.trainable))
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
    loss_fn = model_fns.loss_fn()

    @tf.function
    def train(start, data, seed, max_width=None):
      tf.nest.map_structure(lambda v, t: v.assign(t), weights, start)
      top, high = (1.0, p_max) if max_width is None else (max_width,
                                                            max_width)

      def step(state, batch):
        opt_state, steps, examples = state
        widths = sample_widths(seed, steps, p_min, high, widths_per_step)
        with tf.GradientTape() as tape:
          # A Python `top` stays static (`slimmable.with_width`).
          output = model.forward_pass(slimmable.with_width(batch, top),
                                      training=True)
          loss = output.loss
          for j in range(widths_per_step):
            narrow = slimmable.with_width(batch, widths[j])
            logits = model.predict_on_batch(narrow['x'], training=True)
            loss += loss_fn(narrow['y'], logits)
        gradients = tape.gradient(loss, trainable)
        opt_state, updated = optimizer.next(opt_state, trainable,
                                            tuple(gradients))
        for variable, value in zip(trainable, updated):
          variable.assign(value)
        return (opt_state, steps + 1,
                examples + tf.cast(output.num_examples, tf.int64))

      initial = (optimizer.initialize(specs), tf.constant(0, tf.int32),
                 tf.constant(0, tf.int64))
      _, _, examples = data.reduce(initial, step)
      return collections.OrderedDict(
          weights=tf.nest.map_structure(tf.identity, weights),
          num_examples=examples,
          metrics=model.report_local_unfinalized_metrics())

    return train

  return loop_fn


def build_aequa(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    p_min: float = 0.1,
    p_max: float = 1.0,
    widths_per_step: int = 1,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess] = None,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    client_context: bool = False,
) -> tff.learning.templates.LearningProcess:
  """Builds Aequa's federated slimmable training.

  Type signatures:

      initialize: ( -> S@SERVER)
      next:       (<S@SERVER, {D*}@CLIENTS> ->
                   <state=S@SERVER, metrics=M@SERVER>)

  where D is the model's input without the width; with
  `client_context=True`, `next` takes `{<data=D*, attack=A*>}@CLIENTS`.

  Args:
    model_fn: Returns a fresh `VariableModel` of a slimmable Keras model
      whose input spec carries the width (`model_fns.build_model_spec`).
    client_optimizer_fn: Local optimizer.
    server_optimizer_fn: Server optimizer (applied to the averaged update);
      default SGD with learning rate 1.0 (TFF's default).
    p_min: Smallest width trained (and allocated).
    p_max: Largest sampled width (1.0: the full model).
    widths_per_step: Widths sampled per step besides the full width.
    client_weighting: As in `fed_avg.build_fed_avg`.
    model_distributor: As in `fed_avg.build_fed_avg`.
    model_aggregator: Any `tff.aggregators` factory.
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    client_context: Opt in to per-client attack specs whose seeds seed the
      widths (per-client, per-round seeded draws chosen by the caller).
      Without it the seeds are derived from the broadcast model and each
      client's first batch: reproducible for the same state and data; see
      the module docstring.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: For widths outside (0, 1], p_min > p_max,
      widths_per_step < 0, or a model whose input carries no width.
  """
  contribution.check_width_range(p_min, p_max)
  if widths_per_step < 0:
    raise ValueError(f'widths_per_step must be >= 0, got {widths_per_step}.')
  _check_slimmable(model_fn)
  return fed_avg.build_fed_avg(
      model_fn, client_optimizer_fn, server_optimizer_fn,
      client_weighting=client_weighting,
      model_distributor=model_distributor,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator,
      client_context=client_context,
      training_loop_fn=build_sandwich_loop_fn(p_min, p_max, widths_per_step),
      data_type=plain_data_type(model_fn))
