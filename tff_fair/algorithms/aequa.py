"""Aequa: one slimmable global model, a width per client by contribution.

Tastan et al. (ICML 2025) train a slimmable network federatedly and then
reward each client with a sub-network whose width (hence accuracy) follows
its contribution. No public implementation exists; every choice the paper
leaves open is documented where it is made:

* Training (this module). FedAvg whose local step is "sandwich"-like: in
  every minibatch step a client trains the full width and `widths_per_step`
  widths drawn uniformly from [p_min, p_max), summing the losses (one
  gradient step on the sum). Widths are drawn with a stateless generator
  (`sample_widths`) whose seed folds the step index into the per-client,
  per-round seed the driver sends (the `seed` of the client's
  `tff_fair.attacks` spec), so runs reproduce and no two (client, step)
  pairs share their draws. Every client trains the full width, so every
  coordinate is trained by every client and plain (weighted) averaging
  applies; any
  `tff.aggregators` factory works.
* Width-accuracy curve, allocation and metrics: `tff_fair.fairness` and the
  training driver (the allocation is plain numpy, outside TFF).

Training metrics (loss, accuracy) are those of the full-width pass; the
sampled widths' losses enter the gradient only, so nothing is counted twice.

Type signatures (client data are plain batches; the width is added inside):

    initialize: ( -> S@SERVER)
    next:       (<S@SERVER, {<data=D*, attack=A*>}@CLIENTS> ->
                 <state=S@SERVER, metrics=M@SERVER>)
"""

import collections
from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_fair import attacks
from tff_fair.algorithms import fed_avg
from tff_fair.models import model_fns
from tff_fair.models import slimmable

ModelWeights = tff.learning.models.ModelWeights


def check_width_range(p_min: float, p_max: float) -> None:
  """Raises `ValueError` unless 0 < p_min <= p_max <= 1."""
  if not 0.0 < p_min <= 1.0 or not 0.0 < p_max <= 1.0:
    raise ValueError(
        f'Widths must be in (0, 1]; got p_min={p_min}, p_max={p_max}.')
  if p_min > p_max:
    raise ValueError(f'p_min={p_min} exceeds p_max={p_max}.')


def plain_data_type(model_fn) -> tff.SequenceType:
  """The client data type: the model's input spec without the width."""
  with tf.Graph().as_default():
    spec = model_fn().input_spec
  features, _ = slimmable.split_inputs(spec['x'])
  return tff.SequenceType(tff.types.tensorflow_to_type(
      collections.OrderedDict(x=features, y=spec['y'])))


def sample_widths(seed, step, p_min: float, p_max: float,
                  count: int) -> tf.Tensor:
  """The widths one local step trains besides the full width.

  Args:
    seed: The client's seed (int32[2]: round seed, client index).
    step: The local step's index (int32 scalar).
    p_min: Smallest width.
    p_max: Upper end of the range (drawn widths are < p_max unless p_min ==
      p_max).
    count: Number of widths.

  Returns:
    float32[count], uniform in [p_min, p_max), drawn with a stateless
    generator seeded by `attacks.client_seed(seed, WIDTH_STREAM, step)`.
  """
  return tf.random.stateless_uniform(
      [count], seed=attacks.client_seed(seed, attacks.WIDTH_STREAM, step),
      minval=p_min, maxval=p_max)


def build_sandwich_loop_fn(
    p_min: float, p_max: float, widths_per_step: int
) -> fed_avg.TrainingLoopFn:
  """Aequa's local training loop, in `fed_avg.build_client_work`'s form."""

  def loop_fn(model: tff.learning.models.VariableModel,
              optimizer: tff.learning.optimizers.Optimizer):
    weights = ModelWeights.from_model(model)
    trainable = tuple(tf.nest.flatten(weights.trainable))
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
    loss_fn = model_fns.loss_fn()

    @tf.function
    def train(start, data, seed):
      tf.nest.map_structure(lambda v, t: v.assign(t), weights, start)

      def step(state, batch):
        opt_state, steps, examples = state
        widths = sample_widths(seed, steps, p_min, p_max, widths_per_step)
        with tf.GradientTape() as tape:
          output = model.forward_pass(slimmable.with_width(batch, 1.0),
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
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    p_min: float = 0.1,
    p_max: float = 1.0,
    widths_per_step: int = 1,
) -> tff.learning.templates.LearningProcess:
  """Builds Aequa's federated slimmable training.

  Args:
    model_fn: Returns a fresh `VariableModel` of a slimmable Keras model
      whose input spec carries the width (`slimmable_models.build_model_spec`).
    client_optimizer: Local optimizer.
    server_optimizer: Server optimizer (applied to the averaged update).
    model_aggregator: Any `tff.aggregators` factory.
    p_min: Smallest width trained (and allocated).
    p_max: Largest sampled width (1.0: the full model).
    widths_per_step: Widths sampled per step besides the full width.

  Returns:
    A `tff.learning.templates.LearningProcess`; see the module docstring.

  Raises:
    ValueError: For widths outside (0, 1], p_min > p_max, or
      widths_per_step < 0.
  """
  check_width_range(p_min, p_max)
  if widths_per_step < 0:
    raise ValueError(f'widths_per_step must be >= 0, got {widths_per_step}.')
  return fed_avg.build_fed_avg(
      model_fn, client_optimizer, server_optimizer, model_aggregator,
      training_loop_fn=build_sandwich_loop_fn(p_min, p_max, widths_per_step),
      data_type=plain_data_type(model_fn))
