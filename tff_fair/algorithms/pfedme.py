"""pFedMe: personalized federated learning with Moreau envelopes.

Dinh, Tran and Nguyen, NeurIPS 2020. Client k's personalized model theta_k
solves, around a local copy w of the global model,

    min_theta f_k(theta) + (lambda / 2) ||theta - w||^2,

and w descends the Moreau envelope of f_k, whose gradient at w is
lambda (w - theta*(w)). One client's round, as the reference code
(CharlieDinh/pFedMe) runs it:

1. theta and the local model w_loc both start from the received global
   model w^t; theta persists across the round's batches.
2. For each batch b (an outer step, the reference's "local round"):
   K inner steps on that one batch,
       theta <- theta - p_lr (grad f_k(theta; b) + lambda (theta - w_loc)),
   then one step of the local model,
       w_loc <- w_loc - eta lambda (w_loc - theta).
3. The client sends w^t - w_loc (TFF's update sign) with its weight
   (examples seen); the personalized model is theta (by default averaged
   over the round: below).

The server step is FedAvg's: the server optimizer applied to the weighted
mean of the updates. With SGD at rate beta (`server_optimizer_fn`) that is
pFedMe's w <- (1 - beta) w + beta * mean(w_loc) (the paper's beta = 1 is
plain averaging, beta = 2 its acceleration); another server optimizer (Adam,
momentum) treats the mean update as a pseudo-gradient, as FedOpt does with
FedAvg's. Any `tff.aggregators` factory aggregates the updates.

Where the reference is silent or this module differs:

* Local rounds. The reference draws R (20) batches per round, cycling over
  the client's data; here every batch of the client's data set is one outer
  step, so the number of local rounds is the number of batches (a driver
  passing E epochs of batch size B gives R = E * ceil(n_k / B)).
* The local model's optimizer. eta is `client_optimizer_fn`'s learning
  rate: the local model takes that optimizer's step on the envelope
  gradient lambda (w_loc - theta), its state kept across the round's
  batches. Plain SGD (`build_sgdm` without momentum) is the paper's rule;
  another optimizer is an extension, at the caller's risk (with momentum
  0.9 the round diverges at eta * lambda of 0.3 already, for curvatures
  near the inner steps' limit below). The inner steps are plain SGD at
  `personal_learning_rate`, the paper's.
* Stability. An inner step descends f + (lambda / 2) ||theta - w_loc||^2,
  whose curvature is the loss's h plus lambda: it needs
  p_lr (h + lambda) < 2, so p_lr * lambda < 2 at least (`build_pfedme`
  refuses more). With SGD on the local model, eta * lambda < 2 is needed
  too: for a quadratic loss of any curvature the inner steps can solve,
  the client's round diverges exactly when eta * lambda >= 2, whatever p_lr
  and K (tests/algorithms/pfedme_test.py checks the iteration's spectral
  radius). The defaults are the paper's (lambda 15, K 5, p_lr 0.09, for a
  linear model on MNIST): they leave room for h < 7.2 only, and CNNs
  trained at usual rates are sharper (a LeNet's personalized models on
  Fashion-MNIST stayed at chance with them, and trained with p_lr 0.01 to
  0.03). `tff_fair.training`'s recipe sets p_lr from eta and refuses
  eta * lambda >= 2; here the optimizer is opaque, so the caller keeps it.
* The personalized model. The reference's is theta after the last batch:
  the prox of that one batch's loss, which for a short last batch (a few
  examples, say 4 of 420 at batch size 32) can collapse onto its classes
  (4 MNIST clients, 5 rounds: one ended at 30% training accuracy; the
  personalized models' mean test accuracy was 56%, the global model's
  82%). By default (`average_personal_iterates`) a client returns the mean
  of its thetas after each batch, weighted by the batch's examples: there
  80% (the worst client 80% on its training data); on label-skewed digits
  84% instead of 82% (the global model 25%). Training is the same either
  way.
* Only the sampled clients train (the reference trains every client each
  round and aggregates a sample).

Weights and metrics. Non-trainable weights (if any) follow the model's own
updates in the inner steps, and the local model takes theta's. The
clients' training metrics are the model's over the inner steps, measured on
theta before each step: each batch counts K times (its `num_examples` too),
while the update's weight counts each example once.

Type signatures (`client_outputs`):

    initialize: ( -> S@SERVER)
    next: (<S@SERVER, {D*}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER>)
    next_with_client_outputs: (<S@SERVER, {D*}@CLIENTS> ->
        <state=S@SERVER, metrics=M@SERVER, clients={O}@CLIENTS>)
    O = <personal=W, loss=float32, num_examples=int64>

`next` is `tff.learning.algorithms.build_weighted_fed_avg`'s, so
`tff.learning.programs.train_model` or a loop of your own drives it; the
state is FedAvg's (`fed_avg.build_fed_avg_parts`). `personal` is theta,
`loss` the mean training loss of its inner steps (each measured before its
step) and `num_examples` the examples the client trained on.
`next_with_client_outputs` returns CLIENTS-placed values, so it needs a
context that returns them (TFF's local runtime, `tff_fair.runtime`; one
remote worker); a loop of your own keeps each client's theta:

    output = process.next_with_client_outputs(state, datasets)
    state = output.state
    personal = {cid: c['personal'] for cid, c in zip(ids, output.clients)}

With `client_context=True` (`tff_fair.training` uses it) a client's input
is `fed_avg.client_input(dataset, attack_spec)`, `<data=D*, attack=A*>`,
so chosen clients can attack the global model; the state is the same.
"""

import collections
from collections.abc import Callable, Mapping
import functools
import math
import numbers
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import training_loop

ModelFn = Callable[[], tff.learning.models.VariableModel]

# The reference's defaults (MNIST): lambda, K and the inner steps' rate.
LAMBDA = 15.0
INNER_STEPS = 5
PERSONAL_LEARNING_RATE = 0.09
# What each client returns besides its update (O in the module docstring).
OUTPUTS = ('personal', 'loss', 'num_examples')
# p_lr * lambda and eta * lambda (SGD) must stay below this: see the module
# docstring.
STABLE_RATE_TIMES_LAMBDA = 2.0


def _is_number(value: Any) -> bool:
  return (not isinstance(value, bool) and isinstance(value, numbers.Real)
          and math.isfinite(value))


def check_arguments(lam: Optional[float], inner_steps: int,
                    personal_learning_rate: Optional[float], *,
                    names: Optional[Mapping[str, str]] = None) -> None:
  """Refuses pFedMe's own arguments unless valid and stable (ValueError).

  lambda and the personal learning rate must be finite and > 0, the inner
  steps an int >= 1, and p_lr * lambda < 2 (else the inner steps diverge).

  Args:
    lam: lambda; None when still to be chosen (not checked).
    inner_steps: K.
    personal_learning_rate: p_lr; None when still to be chosen.
    names: How the messages name the arguments (e.g. flags), by argument
      name; default the argument names.
  """
  names = {'lam': 'lambda', 'inner_steps': 'inner_steps',
           'personal_learning_rate': 'personal_learning_rate',
           **(names or {})}
  for name, value in (('lam', lam),
                      ('personal_learning_rate', personal_learning_rate)):
    if value is not None and (not _is_number(value) or value <= 0):
      raise ValueError(
          f'{names[name]} must be a finite number > 0, got {value!r}.')
  if (isinstance(inner_steps, bool)
      or not isinstance(inner_steps, (int, np.integer)) or inner_steps < 1):
    raise ValueError(
        f"{names['inner_steps']} must be an int >= 1, got {inner_steps!r}.")
  if lam is None or personal_learning_rate is None:
    return
  rate = personal_learning_rate
  if rate * lam >= STABLE_RATE_TIMES_LAMBDA:
    raise ValueError(
        f"{names['personal_learning_rate']}={rate} with {names['lam']}={lam}:"
        f' p_lr * lambda = {rate * lam:g} must be < 2, else the inner steps'
        ' theta <- theta - p_lr (grad + lambda (theta - w_loc)) diverge.'
        f" Lower {names['personal_learning_rate']} below"
        f' {STABLE_RATE_TIMES_LAMBDA / lam:.3g} or {names["lam"]} below'
        f' {STABLE_RATE_TIMES_LAMBDA / rate:.3g}.')


def build_local_training(
    model: tff.learning.models.VariableModel,
    optimizer: tff.learning.optimizers.Optimizer,
    *,
    lam: float,
    inner_steps: int,
    personal_learning_rate: float,
    average_personal_iterates: bool = True,
) -> Callable[..., collections.OrderedDict]:
  """One client's pFedMe round (steps 1-2 of the module docstring).

  Args:
    model: A `VariableModel` built inside the caller's computation; it
      holds theta while training.
    optimizer: The local model's optimizer (eta); its gradient is the
      envelope's, lambda (w_loc - theta).
    lam: lambda.
    inner_steps: K, inner steps per batch.
    personal_learning_rate: p_lr, the inner steps' SGD rate.
    average_personal_iterates: The personalized model returned is the
      mean of theta after each batch's inner steps, weighted by the batch's
      examples, rather than theta after the last batch (the reference's).

  Returns:
    A `tf.function` `train(start, data)` taking the received `ModelWeights`
    and a batched data set; it returns `OrderedDict(weights, personal,
    loss, num_examples, metrics)`: the local model w_loc, theta (both
    `ModelWeights`), the mean training loss of the inner steps, the
    examples in `data` and the model's unfinalized metrics.
  """
  # K steps of the house's proximal loop on one batch, anchored at w_loc.
  inner = training_loop.build_steps_on_batch(
      model, tff.learning.optimizers.build_sgdm(
          learning_rate=personal_learning_rate))

  @tf.function
  def train(start: Any, data: tf.data.Dataset):
    trainable = tuple(tf.nest.flatten(start.trainable))
    specs = tuple(tf.TensorSpec(t.shape, t.dtype) for t in trainable)

    def weights(flat_trainable, non_trainable):
      return tff.learning.models.ModelWeights(
          trainable=tf.nest.pack_sequence_as(start.trainable,
                                             list(flat_trainable)),
          non_trainable=list(non_trainable))

    def outer_step(state, batch):
      (theta, non_trainable, w_loc, opt_state, loss_sum, batches, examples,
       average) = state
      solved = inner(weights(theta, non_trainable), batch, inner_steps,
                     anchor=weights(w_loc, ()), lam=lam)
      theta = tuple(tf.nest.flatten(solved['weights'].trainable))
      # The Moreau envelope's gradient at w_loc.
      envelope_gradient = tuple(lam * (w - t) for w, t in zip(w_loc, theta))
      opt_state, w_loc = optimizer.next(opt_state, w_loc, envelope_gradient)
      batch_examples = solved['num_examples'] // inner_steps
      examples += batch_examples
      # Running mean of theta weighted by examples: a short last batch (a
      # few examples of one class), whose prox theta alone can collapse
      # onto that class, weighs little.
      share = tf.cast(batch_examples, tf.float32) / tf.cast(
          tf.maximum(examples, 1), tf.float32)
      average = tuple(a + (t - a) * share for a, t in zip(average, theta))
      return (theta, tuple(solved['weights'].non_trainable), tuple(w_loc),
              opt_state, loss_sum + solved['loss'], batches + 1.0, examples,
              average)

    (theta, non_trainable, w_loc, _, loss_sum, batches, examples,
     average) = data.reduce(
         (trainable, tuple(tf.nest.flatten(start.non_trainable)), trainable,
          optimizer.initialize(specs), tf.constant(0.0), tf.constant(0.0),
          tf.constant(0, tf.int64), trainable), outer_step)
    return collections.OrderedDict(
        weights=weights(w_loc, non_trainable),
        personal=weights(average if average_personal_iterates else theta,
                         non_trainable),
        loss=tf.math.divide_no_nan(loss_sum, batches),
        num_examples=examples,
        metrics=model.report_local_unfinalized_metrics())

  return train


def build_client_update(
    model_fn: ModelFn,
    local_training: Callable[[tff.learning.models.VariableModel],
                             Callable[..., collections.OrderedDict]],
    *,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    client_context: bool = False,
) -> tff.Computation:
  """One client's pFedMe round as a TF computation.

  `(<W, C> -> <ClientResult, M, <personal=W, loss=float32,
  num_examples=int64>>)` with C = D*, or `<data=D*, attack=A*>` under
  `client_context`: the update w^t - w_loc (attacked, under context) and
  its weight as `fed_avg.update_and_weight` makes them, the model's
  metrics, and theta (`client_outputs.build_client_work`'s contract).

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    local_training: `model -> train(start, data)`: `build_local_training`
      with its other arguments bound.
    client_weighting: As in `fed_avg.build_fed_avg`.
    client_context: See `build_pfedme`.
  """
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  input_type = fed_avg.client_input_type(model_fn, client_context)

  @tff.tensorflow.computation(weights_type, input_type)
  def client_update(initial_weights, client_data):
    data, spec, _ = fed_avg.read_client_input(
        client_data, client_context, initial_weights, derive_seed=False)
    trained = local_training(model_fn())(initial_weights, data)
    update, weight = fed_avg.update_and_weight(initial_weights, trained, spec,
                                               client_weighting)
    return (tff.learning.templates.ClientResult(update, weight),
            trained['metrics'],
            collections.OrderedDict((key, trained[key]) for key in OUTPUTS))

  return client_update


def build_pfedme(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    lam: float = LAMBDA,
    inner_steps: int = INNER_STEPS,
    personal_learning_rate: float = PERSONAL_LEARNING_RATE,
    average_personal_iterates: bool = True,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    client_context: bool = False,
) -> client_outputs.ProcessWithClientOutputs:
  """Builds pFedMe (see the module docstring).

  FedAvg's parts (`fed_avg.build_fed_avg_parts`: distributor, aggregator,
  server optimizer, state) with pFedMe's client work, composed by
  `client_outputs.compose`.

  Type signatures:

      initialize: ( -> S@SERVER)
      next: (<S@SERVER, {D*}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER>)
      next_with_client_outputs: (<S@SERVER, {D*}@CLIENTS> ->
          <state=S@SERVER, metrics=M@SERVER,
           clients={<personal=W, loss=float32, num_examples=int64>}@CLIENTS>)

  With `client_context=True` the clients' input is `{<data=D*,
  attack=A*>}@CLIENTS` (`fed_avg.client_input`).

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer_fn: The local model's optimizer; its learning rate is
      eta. SGD (the paper's; 0.005 there) needs eta * lam < 2.
    server_optimizer_fn: Applied to the mean update w^t - w_loc; SGD at
      rate beta is pFedMe's server step (default: beta = 1, the mean of
      the local models).
    lam: lambda, > 0: how closely theta stays to the local model.
    inner_steps: K, inner steps per batch, >= 1.
    personal_learning_rate: p_lr, the inner steps' rate, > 0, with
      p_lr * lam < 2.
    average_personal_iterates: Each client's personalized model is the mean
      of its thetas after each batch, weighted by examples (default;
      stable), rather than the last (the reference's); the training is the
      same.
    client_weighting: As in `fed_avg.build_fed_avg` (the reference weighs
      by training examples: `NUM_EXAMPLES`).
    model_aggregator: Any `tff.aggregators` factory of the updates.
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    client_context: Per-client attack specs in the clients' input; see
      `fed_avg.build_fed_avg`.

  Returns:
    A `client_outputs.ProcessWithClientOutputs`.

  Raises:
    ValueError: For a lambda, K or p_lr out of range, or p_lr * lam >= 2.
    TypeError: For a `client_weighting` that is not a `ClientWeighting`.
  """
  check_arguments(lam, inner_steps, personal_learning_rate)
  fed_avg.check_client_weighting(client_weighting)
  parts = fed_avg.build_fed_avg_parts(
      model_fn, client_optimizer_fn, server_optimizer_fn,
      client_weighting=client_weighting, model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator, client_context=client_context)
  client_update = build_client_update(
      model_fn, functools.partial(
          build_local_training, optimizer=client_optimizer_fn,
          lam=float(lam), inner_steps=int(inner_steps),
          personal_learning_rate=float(personal_learning_rate),
          average_personal_iterates=average_personal_iterates),
      client_weighting=client_weighting, client_context=client_context)
  return client_outputs.compose(
      parts.initial_model_weights_fn, parts.model_weights_distributor,
      client_outputs.build_client_work(
          client_update,
          fed_avg.metrics_aggregation(model_fn, metrics_aggregator)),
      parts.model_update_aggregator, parts.model_finalizer)
