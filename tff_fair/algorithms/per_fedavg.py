"""Per-FedAvg: personalized FedAvg by model-agnostic meta-learning.

Fallah, Mokhtari, Ozdaglar (NeurIPS 2020). The global model theta is
trained so that one step of local gradient descent from it fits each
client well: clients minimize F_i(theta - alpha grad F_i(theta)). A client's
personalized model is that step (or a few) from the global model on its own
training data (`build_adaptation`), never on its validation or test data.

A pass over the client's batches takes one meta-step per batch: D is the
batch, D' the next one and D'' (Hessian-free variant) the one after,
cyclically (a client with one batch uses it as D, D' and D''):

    theta' = theta - alpha grad f(theta; D)
    g      = grad f(theta'; D')
    first-order (fo):  theta <- step(theta, g)
    Hessian-free (hf): theta <- step(theta, g - alpha h),
        h = (Hessian of f(.; D'') at theta) g

where `step` is the client optimizer (SGD at rate beta in the paper; any
`tff.learning` optimizer here). h is computed exactly, by differentiating
grad f(theta; D'') . g (`hessian_product='exact'`, the default), or as the
paper's finite difference [grad f(theta + delta g; D'') -
grad f(theta - delta g; D'')] / (2 delta) (`'finite_difference'`). On ReLU
and max-pooling networks the finite difference at the paper's delta = 1e-3
crosses activation and pooling switches, whose jumps make its error larger
than h itself, and training with it can diverge
(`docs/algorithms/per_fedavg.md`). A pass makes as many model updates as
FedAvg's and costs 2 gradient passes per batch (fo) or about 4 (hf: either
product costs about two); reading each batch once per role, rather
than splitting the batches between the roles, keeps clients with few
batches from taking a fraction of FedAvg's steps. The server is FedAvg's:
the process is `fed_avg.build_fed_avg` with this local loop, so every TFF
aggregator and server optimizer applies and `next` takes plain client
datasets:

    next: (<S@SERVER, {D*}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER>)

(`{<data=D*, attack=A*>}@CLIENTS` with `client_context=True`). The
training metrics count every forward pass of the meta-steps (2 per step
for fo, 3 for hf with the exact product, 4 with the finite difference); a
client's update weight is its examples (those of the batches D), as in
FedAvg.
"""

import collections
from collections.abc import Callable, Sequence
import math
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import per_client_training

VARIANTS = ('fo', 'hf')
HESSIAN_PRODUCTS = ('exact', 'finite_difference')
ModelFn = Callable[[], tff.learning.models.VariableModel]


def check_arguments(alpha: float, variant: str, delta: float,
                    hessian_product: str = HESSIAN_PRODUCTS[0]) -> None:
  """Raises `ValueError` for alpha or delta not > 0 or an unknown choice."""
  if variant not in VARIANTS:
    raise ValueError(f'Unknown Per-FedAvg variant {variant!r}; choose one'
                     f' of {", ".join(VARIANTS)}.')
  if hessian_product not in HESSIAN_PRODUCTS:
    raise ValueError(f'Unknown Hessian-vector product {hessian_product!r};'
                     f' choose one of {", ".join(HESSIAN_PRODUCTS)}.')
  for name, value in (('alpha', alpha), ('delta', delta)):
    if not (isinstance(value, (int, float)) and math.isfinite(value)
            and value > 0):
      raise ValueError(f'{name} must be a finite number > 0, got {value!r}.')


def hessian_vector_product(
    loss_fn: Callable[[], tf.Tensor], variables: Sequence[tf.Variable],
    vector: Sequence[tf.Tensor]) -> tuple[tf.Tensor, ...]:
  """H v at the variables' values: the gradient of (grad loss . v), exact.

  Args:
    loss_fn: No-arg callable computing the loss from `variables`.
    variables: The variables the Hessian is taken in.
    vector: v, one tensor per variable.
  """
  with tf.GradientTape() as outer:
    with tf.GradientTape() as inner:
      loss = loss_fn()
    grad = inner.gradient(loss, variables)
    directional = tf.add_n([tf.reduce_sum(g * tf.stop_gradient(v))
                            for g, v in zip(grad, vector)])
  return tuple(outer.gradient(
      directional, variables,
      unconnected_gradients=tf.UnconnectedGradients.ZERO))


def finite_difference_product(
    loss_fn: Callable[[], tf.Tensor], variables: Sequence[tf.Variable],
    vector: Sequence[tf.Tensor], delta: float) -> tuple[tf.Tensor, ...]:
  """The paper's H v: [grad(w + delta v) - grad(w - delta v)] / (2 delta).

  Args as `hessian_vector_product`, and `delta`, the radius. The variables
  hold their values again on return.
  """
  start = tuple(tf.identity(v) for v in variables)

  def gradient_at(sign):
    for variable, value, direction in zip(variables, start, vector):
      variable.assign(value + sign * delta * direction)
    with tf.GradientTape() as tape:
      loss = loss_fn()
    return tape.gradient(loss, variables)

  plus, minus = gradient_at(1.0), gradient_at(-1.0)
  for variable, value in zip(variables, start):
    variable.assign(value)
  return tuple((p - m) / (2.0 * delta) for p, m in zip(plus, minus))


def build_meta_loop(
    alpha: float, variant: str = 'fo', delta: float = 1e-3,
    hessian_product: str = HESSIAN_PRODUCTS[0]) -> fed_avg.TrainingLoopFn:
  """Per-FedAvg's local loop, as `fed_avg.build_client_work` takes it.

  Args:
    alpha: The inner (personalization) step size.
    variant: 'fo' (first-order) or 'hf' (Hessian-free).
    delta: The radius of 'hf' with the finite-difference product.
    hessian_product: 'hf': 'exact' or 'finite_difference'.

  Returns:
    `(model, optimizer) -> train(start, data, seed)` returning
    `OrderedDict(weights, loss, num_examples, metrics)` (the loss: the mean
    of f(theta'; D') over the meta-steps).
  """
  check_arguments(alpha, variant, delta, hessian_product)
  batches_per_step = 2 if variant == 'fo' else 3

  def build(model, optimizer):
    weights = tff.learning.models.ModelWeights.from_model(model)
    trainable = tuple(tf.nest.flatten(weights.trainable))
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)

    def assign(values):
      for variable, value in zip(trainable, values):
        variable.assign(value)

    def gradient_at(values, batch):
      """grad f(values; batch), its loss and examples (the model moves)."""
      assign(values)
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      return (tape.gradient(output.loss, trainable), output.loss,
              tf.cast(output.num_examples, tf.int64))

    def meta_step(state, batches):
      opt_state, loss_sum, steps, examples = state
      theta = tuple(tf.identity(v) for v in trainable)
      grad, _, n_inner = gradient_at(theta, batches[0])
      adapted = tuple(t - alpha * g for t, g in zip(theta, grad))
      meta_grad, loss, _ = gradient_at(adapted, batches[1])
      if variant == 'hf':
        assign(theta)
        loss_fn = lambda: model.forward_pass(batches[2], training=True).loss
        if hessian_product == 'exact':
          curvature = hessian_vector_product(loss_fn, trainable, meta_grad)
        else:
          curvature = finite_difference_product(loss_fn, trainable,
                                                meta_grad, delta)
        meta_grad = tuple(g - alpha * h for g, h in zip(meta_grad, curvature))
      opt_state, updated = optimizer.next(opt_state, theta, meta_grad)
      assign(updated)
      return opt_state, loss_sum + loss, steps + 1.0, examples + n_inner

    @tf.function
    def train(start, data, seed):
      del seed  # The loop draws nothing at random.
      tf.nest.map_structure(lambda v, t: v.assign(t), weights, start)
      # Each batch with the next (and the one after), cyclically.
      grouped = tf.data.Dataset.zip(tuple(
          data.skip(k).concatenate(data.take(k))
          for k in range(batches_per_step)))
      opt_state, loss_sum, steps, examples = grouped.reduce(
          (optimizer.initialize(specs), tf.constant(0.0), tf.constant(0.0),
           tf.constant(0, tf.int64)),
          lambda state, batches: meta_step(state, batches))
      del opt_state
      return collections.OrderedDict(
          weights=tf.nest.map_structure(tf.identity, weights),
          loss=tf.math.divide_no_nan(loss_sum, steps),
          num_examples=examples,
          metrics=model.report_local_unfinalized_metrics())

    return train

  return build


def build_per_fedavg(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    alpha: float = 0.01,
    variant: str = 'fo',
    delta: float = 1e-3,
    hessian_product: str = HESSIAN_PRODUCTS[0],
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess] = None,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    metrics_aggregator: fed_avg.MetricsAggregator = None,
    client_context: bool = False,
) -> tff.learning.templates.LearningProcess:
  """Builds Per-FedAvg's global model (see the module docstring).

  Type signatures (`tff.learning.algorithms.build_weighted_fed_avg`'s):

      initialize: ( -> S@SERVER)
      next:       (<S@SERVER, {D*}@CLIENTS> ->
                   <state=S@SERVER, metrics=M@SERVER>)

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer_fn: The meta-step's optimizer (the paper's SGD at rate
      beta).
    server_optimizer_fn: As in `fed_avg.build_fed_avg` (default SGD at 1.0).
    alpha: The inner step size, also the personalization step's
      (`build_adaptation`).
    variant: 'fo' (first-order) or 'hf' (Hessian-free).
    delta: The radius of 'hf' with the finite-difference product.
    hessian_product: 'hf': 'exact' (default) or 'finite_difference' (the
      paper's; see the module docstring).
    client_weighting: As in `fed_avg.build_fed_avg`.
    model_distributor: As in `fed_avg.build_fed_avg`.
    model_aggregator: Any `tff.aggregators` factory.
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    client_context: Per-client attack specs; see `fed_avg.build_fed_avg`.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: For alpha or delta not > 0, or an unknown variant or
      product.
  """
  return fed_avg.build_fed_avg(
      model_fn, client_optimizer_fn, server_optimizer_fn,
      client_weighting=client_weighting, model_distributor=model_distributor,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator, client_context=client_context,
      training_loop_fn=build_meta_loop(alpha, variant, delta,
                                       hessian_product))


def build_adaptation(model_fn: ModelFn, alpha: float,
                     steps: int = 1) -> tff.Computation:
  """The personalized models: `steps` SGD steps at rate alpha per client.

  `(<theta@SERVER, {D*}@CLIENTS> -> {theta_i}@CLIENTS)`: from the global
  model, on each client's batches (give it the training data only).
  """
  check_arguments(alpha, VARIANTS[0], 1.0)
  return per_client_training.build_per_client_training(
      model_fn, tff.learning.optimizers.build_sgdm(learning_rate=alpha),
      steps=steps)
