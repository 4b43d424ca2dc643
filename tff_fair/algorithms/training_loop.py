"""The client-side training loop every tff_fair algorithm shares.

One loop serves FedAvg's local training, fine-tuning, standalone training and
Ditto's personal step: minibatch steps of a `tff.learning` optimizer on
F_k(v) + (lam/2)||v - anchor||^2. With lam = 0 it is plain local training;
the proximal gradient term lam * (v - anchor) is how TFF writes FedProx.

Optionally the loop returns the average of its iterates instead of the last
one (Polyak-Ruppert averaging). Ditto's personal step uses it: plain SGD on
one client's skewed data at a usual learning rate oscillates, and now and
then a single minibatch step (gradient norms 5-10x the typical) moves the
model across a decision boundary so that the last iterate predicts one class
for most examples, while the loss averaged over the epoch's batches stays
low. The average of the epoch's iterates does not collapse with it.

The loop is a `tf.function` so that TensorFlow orders the variable writes
and reads (assign the start weights, train, read the result); called from
inside a `tff.tensorflow.computation` it becomes part of that graph.
"""

import collections
from collections.abc import Callable
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff


def build_training_loop(
    model: tff.learning.models.VariableModel,
    optimizer: tff.learning.optimizers.Optimizer,
    average_iterates: bool = False,
) -> Callable[..., collections.OrderedDict]:
  """Returns `train(start, data, anchor=None, lam=0.0)` for `model`.

  Args:
    model: A `VariableModel` built inside the caller's computation.
    optimizer: The optimizer of the local steps.
    average_iterates: Return the mean of the trainable weights after each
      step instead of the weights after the last step (the start weights
      when the data is empty). Non-trainable weights are the last ones.

  Returns:
    A `tf.function` taking start weights (`ModelWeights`), a batched data set
    and optionally anchor weights and lam; it trains `model` in place and
    returns `OrderedDict(weights, loss, num_examples, metrics)`: the trained
    (or averaged) weights, the mean loss over batches (each measured before
    its step), the examples seen and the model's unfinalized metrics.
  """
  weights = tff.learning.models.ModelWeights.from_model(model)
  trainable = tuple(tf.nest.flatten(weights.trainable))
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)

  @tf.function
  def train(start: Any, data: tf.data.Dataset,
            anchor: Optional[Any] = None, lam: Any = 0.0):
    tf.nest.map_structure(lambda v, t: v.assign(t), weights, start)
    anchors = None if anchor is None else tuple(
        tf.nest.flatten(anchor.trainable))

    def step(state, batch):
      opt_state, loss_sum, batches, examples, average = state
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
      if average_iterates:
        # Running mean of the iterates after steps 1..k.
        average = tuple(a + (v - a) / (batches + 1.0)
                        for a, v in zip(average, updated))
      return (opt_state, loss_sum + output.loss, batches + 1.0,
              examples + tf.cast(output.num_examples, tf.int64), average)

    initial = (optimizer.initialize(specs), tf.constant(0.0),
               tf.constant(0.0), tf.constant(0, tf.int64),
               tuple(tf.identity(v) for v in trainable)
               if average_iterates else ())
    _, loss_sum, batches, examples, average = data.reduce(initial, step)
    result = tf.nest.map_structure(tf.identity, weights)
    if average_iterates:
      result = tff.learning.models.ModelWeights(
          trainable=tf.nest.pack_sequence_as(weights.trainable,
                                             list(average)),
          non_trainable=result.non_trainable)
    return collections.OrderedDict(
        weights=result,
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
