"""The client-side training loop every tff_fair algorithm shares.

One loop serves FedAvg's local training, fine-tuning, standalone training and
Ditto's personal step: minibatch steps of a `tff.learning` optimizer on
F_k(v) + (lam/2)||v - anchor||^2. With lam = 0 it is plain local training;
the proximal gradient term lam * (v - anchor) is how TFF writes FedProx.

The loop is a `tf.function` so that TensorFlow orders the variable writes
and reads (assign the start weights, train, read the result); called from
inside a `tff.tensorflow.computation` it becomes part of that graph.
"""

import collections
from collections.abc import Callable
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

ModelWeights = tff.learning.models.ModelWeights


def build_training_loop(
    model: tff.learning.models.VariableModel,
    optimizer: tff.learning.optimizers.Optimizer,
) -> Callable[..., collections.OrderedDict]:
  """Returns `train(start, data, anchor=None, lam=0.0)` for `model`.

  Args:
    model: A `VariableModel` built inside the caller's computation.
    optimizer: The optimizer of the local steps.

  Returns:
    A `tf.function` taking start weights (`ModelWeights`), a batched data set
    and optionally anchor weights and lam; it trains `model` in place and
    returns `OrderedDict(weights, loss, num_examples, metrics)`: the trained
    weights, the mean loss over batches, the examples seen and the model's
    unfinalized metrics.
  """
  weights = ModelWeights.from_model(model)
  trainable = tuple(tf.nest.flatten(weights.trainable))
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)

  @tf.function
  def train(start: Any, data: tf.data.Dataset,
            anchor: Optional[Any] = None, lam: Any = 0.0):
    tf.nest.map_structure(lambda v, t: v.assign(t), weights, start)
    anchors = None if anchor is None else tuple(
        tf.nest.flatten(anchor.trainable))

    def step(state, batch):
      opt_state, loss_sum, batches, examples = state
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      gradients = tape.gradient(output.loss, trainable)
      if anchors is not None:
        gradients = [g + lam * (v - a)
                     for g, v, a in zip(gradients, trainable, anchors)]
      opt_state, updated = optimizer.next(opt_state, trainable,
                                          tuple(gradients))
      for variable, value in zip(trainable, updated):
        variable.assign(value)
      return (opt_state, loss_sum + output.loss, batches + 1.0,
              examples + tf.cast(output.num_examples, tf.int64))

    initial = (optimizer.initialize(specs), tf.constant(0.0),
               tf.constant(0.0), tf.constant(0, tf.int64))
    _, loss_sum, batches, examples = data.reduce(initial, step)
    return collections.OrderedDict(
        weights=tf.nest.map_structure(tf.identity, weights),
        loss=tf.math.divide_no_nan(loss_sum, batches),
        num_examples=examples,
        metrics=model.report_local_unfinalized_metrics(),
    )

  return train


def data_type_of(
    model_fn: Callable[[], tff.learning.models.VariableModel]
) -> tff.SequenceType:
  """The TFF type of a client's batched data set for `model_fn`."""
  with tf.Graph().as_default():
    return tff.SequenceType(
        tff.types.tensorflow_to_type(model_fn().input_spec))
