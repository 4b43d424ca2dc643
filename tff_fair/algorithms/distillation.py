"""Distillation on a public set: what FedDF's server and FedMD's clients share.

Both methods let models of different architectures learn from each other
through their outputs on a public set of unlabeled examples: the average of
several models' logits there is the teacher, and a model is trained to
match it. FedDF (Lin et al. 2020) fits the softmax of the teacher with the
KL divergence at the server; FedMD (Li & Wang 2019) fits the logits
themselves with the mean absolute error at each client.

* `predict_logits`: a model's logits on a set of examples, in batches
  (inside a graph, e.g. a TFF client computation, or a `tf.function`).
* `build_fitting_loop`: minibatch steps of a `tff.learning` optimizer that
  fit a model's logits to target logits, with either loss
  (`kl_divergence`, `mean_absolute_error`).
* `Logits` and `teacher_logits`: the same at the server, in plain
  TensorFlow, for models held as weights (FedDF's received client models).
* `combine_train_metrics`: the training metrics of each architecture's
  cohort of clients as one (a round of either method trains several);
  `check_int`: the check of either builder's counts.
"""

import collections
from collections.abc import Callable, Mapping, Sequence
import numbers
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

ModelFn = Callable[[], tff.learning.models.VariableModel]
# (teacher logits, student logits) -> the mean loss over the batch.
LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
# Examples per forward pass when only logits are computed.
PREDICTION_BATCH = 256


def check_int(name: str, value: Any, minimum: int) -> None:
  """Raises `ValueError` unless `value` is an int >= `minimum` (a count of
  steps, epochs or examples of either method)."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < minimum):
    raise ValueError(f'{name} must be an int >= {minimum}, got {value!r}.')


def kl_divergence(teacher_logits: tf.Tensor,
                  student_logits: tf.Tensor) -> tf.Tensor:
  """Mean KL(softmax(teacher) || softmax(student)) over the examples.

  FedDF's distillation loss (temperature 1).
  """
  teacher_log_p = tf.nn.log_softmax(teacher_logits)
  per_example = tf.reduce_sum(
      tf.exp(teacher_log_p)
      * (teacher_log_p - tf.nn.log_softmax(student_logits)), axis=-1)
  return tf.reduce_mean(per_example)


def mean_absolute_error(teacher_logits: tf.Tensor,
                        student_logits: tf.Tensor) -> tf.Tensor:
  """Mean |teacher - student| over examples and classes (FedMD's loss)."""
  return tf.reduce_mean(tf.abs(teacher_logits - student_logits))


LOSSES = {'kl': kl_divergence, 'mae': mean_absolute_error}


def predict_logits(model: tff.learning.models.VariableModel, x: tf.Tensor,
                   batch_size: int = PREDICTION_BATCH) -> tf.Tensor:
  """The model's logits on `x`, `batch_size` examples at a time.

  In a graph (a TFF computation or a `tf.function`): a forward pass over
  all of a large public set at once would hold every activation.

  Returns:
    float32[N, classes], N = `x`'s first dimension (static when `x`'s is).
  """
  count = tf.shape(x)[0]
  starts = tf.range(0, count, batch_size)

  def body(i, logits):
    batch = x[starts[i]:starts[i] + batch_size]
    return i + 1, logits.write(i, tf.cast(
        model.predict_on_batch(batch, training=False), tf.float32))

  _, logits = tf.while_loop(
      lambda i, _: i < tf.size(starts), body,
      (tf.constant(0), tf.TensorArray(tf.float32, size=tf.size(starts),
                                      infer_shape=False)))
  return tf.ensure_shape(logits.concat(), [x.shape[0], None])


def build_fitting_loop(
    model: tff.learning.models.VariableModel,
    optimizer: tff.learning.optimizers.Optimizer,
    loss_fn: LossFn,
) -> Callable[..., collections.OrderedDict]:
  """Returns `fit(start, data, optimizer_state=None)` for `model`.

  One optimizer step per batch of `data`, whose elements are
  `OrderedDict(x=examples, logits=teacher logits)`, on `loss_fn(teacher
  logits, the model's logits)`; every trainable variable trains.

  Args:
    model: A `VariableModel` built inside the caller's computation (or
      eagerly, for a `tf.function` at the server).
    optimizer: The optimizer of the steps (FedDF and FedMD: Adam 1e-3).
    loss_fn: `kl_divergence` or `mean_absolute_error`.

  Returns:
    A function (a `tf.function` inside) taking start `ModelWeights`, a
    batched data set and an optimizer state to continue from (None: a
    fresh one); it trains `model` in place and returns
    `OrderedDict(weights, optimizer_state, loss)`: the fitted weights,
    the optimizer's state after the last step (pass it to the next call
    to continue the same optimization) and the mean loss over the batches
    (each measured before its step; 0 for no batch).
  """
  weights = tff.learning.models.ModelWeights.from_model(model)
  trainable = tuple(tf.nest.flatten(weights.trainable))
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)

  def step(state, batch):
    optimizer_state, loss_sum, batches = state
    with tf.GradientTape() as tape:
      loss = loss_fn(batch['logits'],
                     model.predict_on_batch(batch['x'], training=True))
    gradients = tape.gradient(loss, trainable)
    optimizer_state, updated = optimizer.next(optimizer_state, trainable,
                                              gradients)
    for variable, value in zip(trainable, updated):
      variable.assign(value)
    return optimizer_state, loss_sum + loss, batches + 1.0

  @tf.function
  def fit_from(start: Any, data: tf.data.Dataset, optimizer_state: Any):
    tf.nest.map_structure(lambda v, t: v.assign(t), weights, start)
    optimizer_state, loss_sum, batches = data.reduce(
        (optimizer_state, tf.constant(0.0), tf.constant(0.0)), step)
    return collections.OrderedDict(
        weights=tf.nest.map_structure(tf.identity, weights),
        optimizer_state=optimizer_state,
        loss=tf.math.divide_no_nan(loss_sum, batches))

  def fit(start: Any, data: tf.data.Dataset,
          optimizer_state: Optional[Any] = None):
    # Tensors in, whatever the caller holds (numpy or tensors), and always
    # an optimizer state: one trace serves every call of a round.
    if optimizer_state is None:
      optimizer_state = optimizer.initialize(specs)
    return fit_from(tf.nest.map_structure(tf.convert_to_tensor, start),
                    data, optimizer_state)

  return fit


class Logits:
  """Logits of models given as weights, at the server (plain TensorFlow).

  One `VariableModel` of the architecture, built when this object is: build
  it after any TFF computation is traced (a model built before TFF traces
  one is not usable after), e.g. once per round.
  """

  def __init__(self, model_fn: ModelFn):
    self.model = model_fn()
    self._weights = tff.learning.models.ModelWeights.from_model(self.model)

    # One trace per shape of `x` (the public set, the validation set).
    @tf.function(reduce_retracing=True)
    def logits(weights, x):
      tf.nest.map_structure(lambda v, t: v.assign(t), self._weights, weights)
      return predict_logits(self.model, x)

    self._logits = logits

  def __call__(self, weights: tff.learning.models.ModelWeights,
               x: np.ndarray) -> np.ndarray:
    """float32[N, classes]: the logits of the model `weights` on `x`."""
    return self._logits(weights, tf.constant(x)).numpy()


def teacher_logits(
    models: Sequence[tuple[str, tff.learning.models.ModelWeights]],
    model_fns: collections.abc.Mapping[str, ModelFn],
    x: np.ndarray,
) -> np.ndarray:
  """The ensemble's logits on `x`: the mean of every model's logits.

  Args:
    models: (architecture, weights) of each model of the ensemble.
    model_fns: Architecture -> its model builder.
    x: The examples.

  Returns:
    float32[N, classes].
  """
  if not models:
    raise ValueError('An ensemble needs at least one model.')
  runners = {}
  total = None
  for architecture, weights in models:
    if architecture not in runners:
      runners[architecture] = Logits(model_fns[architecture])
    logits = runners[architecture](weights, x)
    total = logits if total is None else total + logits
  return total / len(models)


def combine_train_metrics(
    metrics: Sequence[Mapping[str, Any]]) -> collections.OrderedDict:
  """Training metrics of several cohorts as one: counts (`num_*`) summed,
  the others averaged weighted by `num_examples`."""
  if not metrics:
    return collections.OrderedDict()
  examples = np.array([float(m['num_examples']) for m in metrics])
  combined = collections.OrderedDict()
  for name in metrics[0]:
    values = np.array([float(m[name]) for m in metrics])
    combined[name] = (values.sum() if name.startswith('num_') else
                      float(np.average(values, weights=examples))
                      if examples.sum() else float('nan'))
  return combined
