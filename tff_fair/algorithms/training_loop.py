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

`build_paired_training_loop` trains two models on the same batches in one
pass (Ditto's interleaved round: a plain model and a proximal one), from
the very steps of the single loop.

A loop may train only some of the trainable variables (`trained_variables`)
and keep the others at their start values: FedRep trains a client's head
with the body frozen, then the body with the head frozen.

The loop is a `tf.function` so that TensorFlow orders the variable writes
and reads (assign the start weights, train, read the result); called from
inside a `tff.tensorflow.computation` it becomes part of that graph.
"""

import collections
from collections.abc import Callable, Sequence
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff


class _LocalSteps:
  """One model's minibatch steps, in pieces a `Dataset.reduce` can combine.

  `start` assigns the start weights and returns the reduce's initial state,
  `step` takes one step on a batch, `result` reads the outcome. One loop
  (`build_training_loop`) or two models on the same batches
  (`build_paired_training_loop`) are built from these, so both take exactly
  the same steps.
  """

  def __init__(self, model: tff.learning.models.VariableModel,
               optimizer: tff.learning.optimizers.Optimizer,
               average_iterates: bool,
               trained_variables: Optional[Sequence[int]] = None):
    self._model = model
    self._optimizer = optimizer
    self._average_iterates = average_iterates
    self._weights = tff.learning.models.ModelWeights.from_model(model)
    trainable = tuple(tf.nest.flatten(self._weights.trainable))
    self._positions = _check_positions(trained_variables, len(trainable))
    # The variables the steps update; the others keep their start values.
    self._trainable = tuple(trainable[i] for i in self._positions)
    self._specs = tuple(tf.TensorSpec(v.shape, v.dtype)
                        for v in self._trainable)

  def start(self, start: Any) -> tuple[Any, ...]:
    tf.nest.map_structure(lambda v, t: v.assign(t), self._weights, start)
    return (self._optimizer.initialize(self._specs), tf.constant(0.0),
            tf.constant(0.0), tf.constant(0, tf.int64),
            tuple(tf.identity(v) for v in self._trainable)
            if self._average_iterates else ())

  def step(self, state: tuple[Any, ...], batch: Any,
           anchors: Optional[tuple[Any, ...]] = None,
           lam: Any = 0.0) -> tuple[Any, ...]:
    opt_state, loss_sum, batches, examples, average = state
    trainable = self._trainable
    with tf.GradientTape() as tape:
      output = self._model.forward_pass(batch, training=True)
    gradients = tape.gradient(output.loss, trainable)
    if anchors is not None:
      anchors = [anchors[i] for i in self._positions]
      gradients = [g + lam * (v - a)
                   for g, v, a in zip(gradients, trainable, anchors)]
    opt_state, updated = self._optimizer.next(opt_state, trainable,
                                              tuple(gradients))
    for variable, value in zip(trainable, updated):
      variable.assign(value)
    if self._average_iterates:
      # Running mean of the iterates after steps 1..k.
      average = tuple(a + (v - a) / (batches + 1.0)
                      for a, v in zip(average, updated))
    return (opt_state, loss_sum + output.loss, batches + 1.0,
            examples + tf.cast(output.num_examples, tf.int64), average)

  def result(self, state: tuple[Any, ...]) -> collections.OrderedDict:
    _, loss_sum, batches, examples, average = state
    weights = tf.nest.map_structure(tf.identity, self._weights)
    if self._average_iterates:
      trainable = list(tf.nest.flatten(weights.trainable))
      for i, mean in zip(self._positions, average):
        trainable[i] = mean
      weights = tff.learning.models.ModelWeights(
          trainable=tf.nest.pack_sequence_as(self._weights.trainable,
                                             trainable),
          non_trainable=weights.non_trainable)
    return collections.OrderedDict(
        weights=weights,
        loss=tf.math.divide_no_nan(loss_sum, batches),
        num_examples=examples,
        metrics=self._model.report_local_unfinalized_metrics(),
    )


def _check_positions(trained_variables: Optional[Sequence[int]],
                     count: int) -> tuple[int, ...]:
  """The positions of the trained variables among `count` (default all)."""
  if trained_variables is None:
    return tuple(range(count))
  positions = tuple(int(i) for i in trained_variables)
  if (not positions or len(set(positions)) != len(positions)
      or not all(0 <= i < count for i in positions)):
    raise ValueError(
        f'trained_variables must be distinct positions in [0, {count}) of'
        " the model's trainable variables, at least one; got"
        f' {list(trained_variables)}.')
  return positions


def _flat_trainable(weights: Any) -> Optional[tuple[Any, ...]]:
  return None if weights is None else tuple(
      tf.nest.flatten(weights.trainable))


def build_training_loop(
    model: tff.learning.models.VariableModel,
    optimizer: tff.learning.optimizers.Optimizer,
    average_iterates: bool = False,
    trained_variables: Optional[Sequence[int]] = None,
) -> Callable[..., collections.OrderedDict]:
  """Returns `train(start, data, anchor=None, lam=0.0)` for `model`.

  Args:
    model: A `VariableModel` built inside the caller's computation.
    optimizer: The optimizer of the local steps.
    average_iterates: Return the mean of the trainable weights after each
      step instead of the weights after the last step (the start weights
      when the data is empty). Non-trainable weights are the last ones.
    trained_variables: Positions, in the order of the model's trainable
      variables, of those the steps update (default: all). The others are
      frozen: they keep their start values and take no gradient, and the
      optimizer's state covers only the trained ones.

  Returns:
    A `tf.function` taking start weights (`ModelWeights`), a batched data set
    and optionally anchor weights and lam; it trains `model` in place and
    returns `OrderedDict(weights, loss, num_examples, metrics)`: the trained
    (or averaged) weights, the mean loss over batches (each measured before
    its step), the examples seen and the model's unfinalized metrics.

  Raises:
    ValueError: For positions that repeat, lie outside the trainable
      variables, or are none.
  """
  steps = _LocalSteps(model, optimizer, average_iterates, trained_variables)

  @tf.function
  def train(start: Any, data: tf.data.Dataset,
            anchor: Optional[Any] = None, lam: Any = 0.0):
    anchors = _flat_trainable(anchor)
    final = data.reduce(steps.start(start),
                        lambda state, batch: steps.step(state, batch,
                                                        anchors, lam))
    return steps.result(final)

  return train


def build_steps_on_batch(
    model: tff.learning.models.VariableModel,
    optimizer: tff.learning.optimizers.Optimizer,
) -> Callable[..., collections.OrderedDict]:
  """Returns `train(start, batch, steps, anchor=None, lam=0.0)`: the loop's
  steps, `steps` times on one batch.

  pFedMe's inner problem: `build_training_loop` on the batch repeated would
  take the same steps, but a data set built per batch inside the clients'
  pass costs about as much as the steps themselves. Returns what
  `build_training_loop`'s `train` returns.
  """
  local_steps = _LocalSteps(model, optimizer, average_iterates=False)

  @tf.function
  def train(start: Any, batch: Any, steps: Any,
            anchor: Optional[Any] = None, lam: Any = 0.0):
    anchors = _flat_trainable(anchor)
    state = local_steps.start(start)
    for _ in tf.range(steps):
      state = local_steps.step(state, batch, anchors, lam)
    return local_steps.result(state)

  return train


def build_paired_training_loop(
    model: tff.learning.models.VariableModel,
    optimizer: tff.learning.optimizers.Optimizer,
    proximal_model: tff.learning.models.VariableModel,
    proximal_optimizer: tff.learning.optimizers.Optimizer,
    proximal_average_iterates: bool = False,
) -> Callable[..., tuple[collections.OrderedDict, collections.OrderedDict]]:
  """Two models trained on the same batches in one pass over the data.

  Ditto's interleaved round on a client: per batch, one step of `model`
  (plain local training, FedAvg's) and one step of `proximal_model` on
  F(v) + (lam/2)||v - anchor||^2. Neither step reads the other's weights,
  so the result equals two `build_training_loop` passes over the same
  batches; one pass reads the data once and lets TensorFlow run the two
  independent steps side by side.

  Args:
    model: A `VariableModel` built inside the caller's computation.
    optimizer: `model`'s optimizer.
    proximal_model: Another `VariableModel` of the same architecture.
    proximal_optimizer: `proximal_model`'s optimizer.
    proximal_average_iterates: As `build_training_loop`'s
      `average_iterates`, for `proximal_model`.

  Returns:
    A `tf.function` `train(start, proximal_start, data, anchor, lam)`
    returning `(result, proximal_result)`, each as `build_training_loop`'s.
  """
  steps = _LocalSteps(model, optimizer, False)
  proximal_steps = _LocalSteps(proximal_model, proximal_optimizer,
                               proximal_average_iterates)

  @tf.function
  def train(start: Any, proximal_start: Any, data: tf.data.Dataset,
            anchor: Any, lam: Any):
    anchors = _flat_trainable(anchor)

    def step(state, batch):
      plain, proximal = state
      return (steps.step(plain, batch),
              proximal_steps.step(proximal, batch, anchors, lam))

    plain, proximal = data.reduce(
        (steps.start(start), proximal_steps.start(proximal_start)), step)
    return steps.result(plain), proximal_steps.result(proximal)

  return train


def data_type_of(
    model_fn: Callable[[], tff.learning.models.VariableModel]
) -> tff.SequenceType:
  """The TFF type of a client's batched data set for `model_fn`."""
  with tf.Graph().as_default():
    return tff.SequenceType(
        tff.types.tensorflow_to_type(model_fn().input_spec))
