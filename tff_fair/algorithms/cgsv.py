"""CGSV: gradient rewards by cosine gradient Shapley values (Xu et al. 2021).

A baseline of Aequa. Every client holds its own model; the better its
updates agree with the aggregate, the higher its reputation and the more
of the aggregate it receives. A round, as the reference code does it:

1. Client i trains from its own model w_i and normalizes its update g_i
   (over all layers): g~_i = Gamma g_i / (||g_i|| + 1e-7).
2. The server aggregates g_agg = sum_i r_i g~_i / sum_i r_i over the
   round's clients, r_i their reputations. Reputations start at 0, so the
   first round weighs clients by data size (`client_weighting`). The
   server model moves by g_agg.
3. phi_i = cos(g~_i, g_agg); r_i <- alpha r_i + (1 - alpha) phi_i; every
   r_j is clamped to >= 1e-3, then r is normalized to sum 1.
4. Reward shares q_i = tanh(beta r_i) / max_j tanh(beta r_j). Client i
   receives g_agg with all but the ceil(q_i * size) largest-magnitude
   entries of each layer zeroed (`sparsify`) and applies it to its own
   model; its own update is not applied otherwise (the reference's "do not
   top up with own gradients").

(Updates follow TFF's sign, `initial - trained`, so applying one is a
subtraction.) Where the reference, which trains every client every round,
is silent:

* Partial participation: only the round's clients' reputations move; the
  clamp and the normalization cover all clients, and q uses the largest
  share over all clients.
* Top-k: exactly ceil(q_i * size) entries per layer (ties broken by
  position), with the product computed so float32 rounding never adds an
  entry. The reference keeps min(k, size - 1) entries and every entry tied
  with the k-th, so even its top client loses one entry per layer.

Identity and per-client models. Reputations are server state, one per
client index in [0, num_clients), and each client trains its own model, so
both need the client context (`client_context=True`): each client's input
is `client_outputs.model_client_input(dataset, model, attack_spec)`,
`<data=D*, attack=A*, model=W>`; the spec's client index
(`update_attacks.attack_spec(..., client_index=i)`) identifies it. The new
models are per-client values, which `next` (a `LearningProcess`'s) cannot
return: `next_with_client_outputs` (`client_outputs`) returns them, and the
driver keeps them between rounds (`client_outputs.ClientModels` in memory,
as Ditto's personal models). Each client receives only its sparsified
aggregate, chosen at the server by its index (`tff.federated_select`).

Without client context (plain data sets, TFF's default) nobody can be told
apart: every client trains from the server model and weighs by data size
in every round (as in CGSV's first round), no reputation is tracked (they
stay 0, q = 1), and every client receives the whole aggregate. That is
FedAvg of Gamma-normalized updates; the clients' models are the server's.

Type signatures (`client_outputs`):

    initialize: ( -> S@SERVER)
    next: (<S@SERVER, {C}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER>)
    next_with_client_outputs: (<S@SERVER, {C}@CLIENTS> ->
        <state=S@SERVER, metrics=M@SERVER, clients={O}@CLIENTS>)
    C = D* (plain) or <data=D*, attack=A*, model=W> (context)
    S.aggregator = <reputation=<reputations=float32[N], round_num=int32>,
                    inner=the model aggregator's state>
    O = <model=W, phi=float32, reputation=float32, reward=float32>
    M = <distributor=(), client_work=<train=T>, aggregator=<phis=float32[N],
         participants=float32[N], reputations=float32[N],
         rewards=float32[N], aggregation=the model aggregator's>,
         finalizer=the server optimizer's>

with N = num_clients; in M, clients that did not take part have phi 0.
The reputation-weighted mean is any weighted `tff.aggregators` factory's
(`model_aggregator`: CGSV's is `MeanFactory`), and the server model moves
by the aggregate through the server optimizer (CGSV's: plain SGD at rate
1, the model plus the aggregate); each client's reward is the aggregate
itself, sparsified.
"""

import collections
from collections.abc import Callable
import math
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import training_loop

# The reference's floor of an update's norm and of a reputation.
NORM_EPSILON = 1e-7
MIN_REPUTATION = 1e-3
# Floor of the product of norms in the cosine (torch's cosine_similarity
# eps in the reference).
_COSINE_EPSILON = 1e-10


def _flat(structure) -> tf.Tensor:
  return tf.concat([tf.reshape(t, [-1]) for t in tf.nest.flatten(structure)],
                   axis=0)


def normalized_update(update, norm_gamma: float):
  """g~ = Gamma g / (||g|| + 1e-7), the norm over every layer together."""
  scale = norm_gamma / (tf.norm(_flat(update)) + NORM_EPSILON)
  return tf.nest.map_structure(lambda t: t * scale, update)


def cosine(a, b) -> tf.Tensor:
  """Cosine of two structures flattened to vectors (0 if one is zero)."""
  a, b = _flat(a), _flat(b)
  return tf.reduce_sum(a * b) / tf.maximum(tf.norm(a) * tf.norm(b),
                                           _COSINE_EPSILON)


def update_reputations(reputations, phis, participants,
                       alpha: float) -> tf.Tensor:
  """One round's reputations (float32[N]).

  Args:
    reputations: The reputations before the round.
    phis: This round's cosines (any value where not a participant).
    participants: 1 for the round's clients, 0 for the others.
    alpha: Weight of the past.

  Returns:
    r_i <- alpha r_i + (1 - alpha) phi_i for participants (others keep
    r_i), clamped to >= 1e-3, normalized to sum 1.
  """
  moved = tf.where(participants > 0,
                   alpha * reputations + (1.0 - alpha) * phis, reputations)
  clamped = tf.maximum(moved, MIN_REPUTATION)
  return clamped / tf.reduce_sum(clamped)


def reward_shares(reputations, beta: float) -> tf.Tensor:
  """q = tanh(beta r) / max tanh(beta r): the top client's share is 1."""
  shares = tf.tanh(beta * reputations)
  return shares / tf.reduce_max(shares)


def kept_entries(share, size: int) -> tf.Tensor:
  """ceil(share * size) in [0, size] (int32), immune to float32 rounding.

  0.3 in float32 is 0.30000001, whose product with 10 would ceil to 4: the
  product is computed in float64 and a tolerance of 1e-6 * size absorbs
  such excess (as `slimmable.active_size`).
  """
  product = tf.cast(share, tf.float64) * float(size)
  count = tf.math.ceil(product - 1e-6 * size)
  return tf.cast(tf.clip_by_value(count, 0.0, float(size)), tf.int32)


def sparsify(update, share):
  """Keeps the ceil(share * size) largest |entries| of each tensor.

  Args:
    update: A structure of tensors (e.g. the aggregate, per layer).
    share: A float in [0, 1] (a tensor or a number).

  Returns:
    The structure with every other entry zeroed; among entries of equal
    magnitude the earlier (in row-major order) is kept.
  """

  def keep_top(tensor):
    size = int(np.prod(tensor.shape))
    flat = tf.reshape(tensor, [-1])
    _, indices = tf.math.top_k(tf.abs(flat), k=kept_entries(share, size))
    mask = tf.scatter_nd(indices[:, None],
                         tf.ones_like(indices, flat.dtype), [size])
    return tf.reshape(flat * mask, tensor.shape)

  return tf.nest.map_structure(keep_top, update)




def _check_arguments(num_clients, alpha, beta, norm_gamma) -> None:
  client_outputs.check_num_clients(num_clients)
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f'alpha must be in [0, 1], got {alpha}.')
  for name, value in (('beta', beta), ('norm_gamma', norm_gamma)):
    if not (math.isfinite(value) and value > 0):
      raise ValueError(f'{name} must be a finite number > 0, got {value}.')


def build_reputation_aggregator(
    update_type: tff.Type,
    *,
    num_clients: int,
    alpha: float,
    beta: float,
    inner: tff.aggregators.WeightedAggregationFactory,
    client_context: bool,
) -> tff.templates.AggregationProcess:
  """CGSV's aggregation: normalized updates weighted by reputations.

  The value each client sends is `<update=g~_i, index=int32>` with its data
  weight; a client's weight is its reputation r_i from the second round
  on (steps 2 and 3 of the module docstring). The weighted mean itself is
  `inner`'s (`tff.aggregators.MeanFactory()` is CGSV's; a robust or
  compressed weighted factory aggregates the same weighted updates), so
  every client is scored against what the server really applies.

  Type signature of `next`:

      (<S@SERVER, {<update=U, index=int32>}@CLIENTS, {float32}@CLIENTS> ->
       <state=S@SERVER, result=U@SERVER,
        measurements=<phis=float32[N], participants=float32[N],
                      reputations=float32[N], rewards=float32[N],
                      aggregation=I>@SERVER>)
      S = <reputation=<reputations=float32[N], round_num=int32>, inner=...>

  Without client context nobody is identified: data weights every round,
  no reputation moves and every share is 1.
  """
  inner_process = inner.create(update_type, tff.TensorType(np.float32))
  value_type = tff.types.to_type(collections.OrderedDict(
      update=update_type, index=np.int32))

  @tff.tensorflow.computation
  def initial_reputations():
    return collections.OrderedDict(reputations=tf.zeros([num_clients]),
                                   round_num=tf.constant(0))

  reputation_type = initial_reputations.type_signature.result

  @tff.tensorflow.computation(reputation_type, np.int32, np.float32)
  def client_weight(reputation, index, data_weight):
    return tf.cond(reputation['round_num'] > 0,
                   lambda: tf.gather(reputation['reputations'], index),
                   lambda: data_weight)

  @tff.tensorflow.computation(update_type, update_type, np.int32)
  def score(normalized, aggregate, index):
    if not client_context:  # Nobody to attribute the cosine to.
      return collections.OrderedDict(phis=tf.zeros([num_clients]),
                                     participants=tf.zeros([num_clients]))
    phi = cosine(normalized, aggregate)
    return collections.OrderedDict(
        phis=client_outputs.one_hot_sum(index, phi, num_clients),
        participants=client_outputs.one_hot_sum(index, 1.0, num_clients))

  @tff.tensorflow.computation(reputation_type, score.type_signature.result)
  def next_reputations(reputation, scores):
    if client_context:
      reputations = update_reputations(
          reputation['reputations'], scores['phis'], scores['participants'],
          alpha)
      shares = reward_shares(reputations, beta)
    else:  # Nobody identified: no reputation, everyone gets everything.
      reputations = reputation['reputations']
      shares = tf.ones([num_clients])
    return collections.OrderedDict(
        reputations=reputations,
        round_num=reputation['round_num'] + 1), shares

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(collections.OrderedDict(
        reputation=tff.federated_eval(initial_reputations, tff.SERVER),
        inner=inner_process.initialize()))

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(value_type, tff.CLIENTS),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def next_fn(state, value, data_weight):
    if client_context:
      weight = tff.federated_map(client_weight, (
          tff.federated_broadcast(state.reputation), value.index,
          data_weight))
    else:
      weight = data_weight
    aggregated = inner_process.next(state.inner, value.update, weight)
    scores = tff.federated_sum(tff.federated_map(score, (
        value.update, tff.federated_broadcast(aggregated.result),
        value.index)))
    reputation, shares = tff.federated_map(next_reputations,
                                           (state.reputation, scores))
    return tff.templates.MeasuredProcessOutput(
        tff.federated_zip(collections.OrderedDict(
            reputation=reputation, inner=aggregated.state)),
        aggregated.result,
        tff.federated_zip(collections.OrderedDict(
            phis=scores.phis, participants=scores.participants,
            reputations=reputation.reputations, rewards=shares,
            aggregation=aggregated.measurements)))

  return tff.templates.AggregationProcess(init_fn, next_fn)


def build_cgsv(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    num_clients: int,
    alpha: float = 0.95,
    beta: float = 1.0,
    norm_gamma: float = 0.5,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[
        tff.aggregators.WeightedAggregationFactory] = None,
    metrics_aggregator: fed_avg.MetricsAggregator = None,
    client_context: bool = False,
) -> client_outputs.ProcessWithClientOutputs:
  """Builds CGSV (see the module docstring).

  TFF's four parts (`client_outputs.compose`): a broadcast of the server
  model; client work that trains each client's own model and sends its
  normalized update; `build_reputation_aggregator` around `model_aggregator`;
  the server optimizer applied to the aggregate. After the server step
  each client receives its reward (the aggregate sparsified to its share)
  on its own model. `next` and `next_with_client_outputs` take
  `{C}@CLIENTS` with C = D* by default and `<data=D*, attack=A*, model=W>`
  under `client_context`; their types are in the module docstring.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer_fn: Local optimizer.
    server_optimizer_fn: Moves the server model by the aggregate (as a
      gradient); default SGD with learning rate 1.0, CGSV's (the model
      plus the aggregate). Clients' rewards are the aggregate itself.
    num_clients: How many clients there are; client indices (in the
      attack specs) lie in [0, num_clients).
    alpha: Weight of the past reputation (0.95 in CGSV).
    beta: Reward steepness: q_i = tanh(beta r_i) / max tanh(beta r_j);
      larger beta evens the shares out.
    norm_gamma: Gamma, the norm every update is scaled to.
    client_weighting: Weights of the first round (and of every round
      without client context): `NUM_EXAMPLES` (CGSV's data size) or
      `UNIFORM`.
    model_aggregator: A weighted `tff.aggregators` factory that computes
      the reputation-weighted mean (default `MeanFactory()`, CGSV's; e.g.
      `tff.learning.robust_aggregator()` or `compression_aggregator()`).
      An unweighted one (the DP aggregator) would drop the reputations.
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    client_context: Per-client models and identities (module docstring).

  Returns:
    A `client_outputs.ProcessWithClientOutputs`.

  Raises:
    ValueError: For num_clients < 1, alpha outside [0, 1], or beta or
      norm_gamma not > 0.
    TypeError: For an unweighted `model_aggregator`.
  """
  _check_arguments(num_clients, alpha, beta, norm_gamma)
  fed_avg.check_client_weighting(client_weighting)
  model_aggregator = model_aggregator or tff.aggregators.MeanFactory()
  if not isinstance(model_aggregator,
                    tff.aggregators.WeightedAggregationFactory):
    raise TypeError(
        'CGSV weighs each update by its reputation: model_aggregator must be'
        f' a weighted tff.aggregators factory, got {model_aggregator!r}.')
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  data_type = training_loop.data_type_of(model_fn)
  input_type = (fed_avg.context_type(data_type, model=weights_type)
                if client_context else data_type)

  @tff.tensorflow.computation(weights_type, input_type)
  def client_update(global_weights, client_data):
    spec, trained, update, data_weight = client_outputs.train_own_model(
        model_fn, client_optimizer_fn, client_data, client_context,
        global_weights, client_weighting)
    normalized = normalized_update(update, norm_gamma)
    # Without context nobody is identified: every client reads entry 0.
    index = (client_outputs.client_index(spec, num_clients)
             if client_context else tf.constant(0))
    return (tff.learning.templates.ClientResult(
        update=collections.OrderedDict(update=normalized, index=index),
        update_weight=data_weight),
            trained['metrics'],
            collections.OrderedDict(index=index, normalized=normalized))

  update_type = client_update.type_signature.result[0].update.update
  aggregator = build_reputation_aggregator(
      update_type, num_clients=num_clients, alpha=alpha, beta=beta,
      inner=model_aggregator, client_context=client_context)

  reward_type = tff.types.to_type(collections.OrderedDict(
      aggregate=update_type,
      reputations=tff.TensorType(np.float32, [num_clients]),
      shares=tff.TensorType(np.float32, [num_clients])))

  @tff.tensorflow.computation(reward_type, np.int32)
  def select_reward(reward, index):
    share = tf.gather(reward['shares'], index)
    return collections.OrderedDict(  # Keys sorted: `select_by_index`.
        reputation=tf.gather(reward['reputations'], index), reward=share,
        update=sparsify(reward['aggregate'], share))

  received_type = select_reward.type_signature.result

  @tff.tensorflow.computation(weights_type, tff.SequenceType(received_type),
                              update_type, update_type)
  def receive(own_model, received, normalized, aggregate):
    reward = fed_avg.first_element(received)
    return collections.OrderedDict(
        model=client_outputs.apply_update(own_model, reward['update']),
        phi=cosine(normalized, aggregate),
        reputation=reward['reputation'], reward=reward['reward'])

  def reward_fn(state, client_data, work, aggregated, finalized):
    del finalized  # Rewards are the aggregate, not the server's step.
    sent = work.result.outputs
    reward = tff.federated_zip(collections.OrderedDict(
        aggregate=aggregated.result,
        reputations=aggregated.measurements.reputations,
        shares=aggregated.measurements.rewards))
    # Each client gets only its own sparsified aggregate, chosen by its
    # index (without context: index 0 and share 1 for all, the whole).
    received = client_outputs.select_by_index(sent.index, num_clients,
                                              reward, select_reward)
    own_models = (client_data.model if client_context
                  else tff.federated_broadcast(state.global_model_weights))
    return tff.federated_map(receive, (
        own_models, received, sent.normalized,
        tff.federated_broadcast(aggregated.result))), None

  return client_outputs.compose(
      client_outputs.initial_weights_fn(model_fn),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_outputs.build_client_work(
          client_update,
          fed_avg.metrics_aggregation(model_fn, metrics_aggregator)),
      aggregator,
      tff.learning.templates.build_apply_optimizer_finalizer(
          server_optimizer_fn or fed_avg.default_server_optimizer(),
          weights_type),
      reward_fn=reward_fn)
