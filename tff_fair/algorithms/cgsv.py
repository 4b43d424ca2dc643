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
    S.aggregator = <reputations=float32[N], round_num=int32>
    O = <model=W, phi=float32, reputation=float32, reward=float32>
    M = <client_work=<train=T>, aggregator=<phis=float32[N],
         participants=float32[N], reputations=float32[N],
         rewards=float32[N]>>

with N = num_clients; in M, clients that did not take part have phi 0.
"""

import collections
from collections.abc import Callable
import math

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


def build_cgsv(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    num_clients: int,
    alpha: float = 0.95,
    beta: float = 1.0,
    norm_gamma: float = 0.5,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    metrics_aggregator: fed_avg.MetricsAggregator = None,
    client_context: bool = False,
) -> client_outputs.ProcessWithClientOutputs:
  """Builds CGSV (see the module docstring).

  `next` and `next_with_client_outputs` take `{C}@CLIENTS` with C = D*
  by default and `<data=D*, attack=A*, model=W>` under `client_context`;
  their types are in the module docstring.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer_fn: Local optimizer.
    num_clients: How many clients there are; client indices (in the
      attack specs) lie in [0, num_clients).
    alpha: Weight of the past reputation (0.95 in CGSV).
    beta: Reward steepness: q_i = tanh(beta r_i) / max tanh(beta r_j);
      larger beta evens the shares out.
    norm_gamma: Gamma, the norm every update is scaled to.
    client_weighting: Weights of the first round (and of every round
      without client context): `NUM_EXAMPLES` (CGSV's data size) or
      `UNIFORM`.
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    client_context: Per-client models and identities (module docstring).

  Returns:
    A `client_outputs.ProcessWithClientOutputs`.

  Raises:
    ValueError: For num_clients < 1, alpha outside [0, 1], or beta or
      norm_gamma not > 0.
  """
  _check_arguments(num_clients, alpha, beta, norm_gamma)
  fed_avg.check_client_weighting(client_weighting)
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  data_type = training_loop.data_type_of(model_fn)
  input_type = (fed_avg.context_type(data_type, model=weights_type)
                if client_context else data_type)
  reputation_type = tff.types.to_type(collections.OrderedDict(
      reputations=tff.TensorType(np.float32, [num_clients]),
      round_num=np.int32))

  @tff.tensorflow.computation(weights_type, reputation_type, input_type)
  def client_update(global_weights, reputation_state, client_data):
    spec, trained, update, data_weight = client_outputs.train_own_model(
        model_fn, client_optimizer_fn, client_data, client_context,
        global_weights, client_weighting)
    normalized = normalized_update(update, norm_gamma)
    if client_context:
      index = client_outputs.client_index(spec, num_clients)
      weight = tf.cond(
          reputation_state['round_num'] > 0,
          lambda: tf.gather(reputation_state['reputations'], index),
          lambda: data_weight)
    else:
      index = tf.constant(0)  # Nobody identified: all read entry 0.
      weight = data_weight
    sums = collections.OrderedDict(
        update=tf.nest.map_structure(lambda t: weight * t, normalized),
        weight=weight)
    return sums, normalized, index, trained['metrics']

  sums_type = client_update.type_signature.result[0]
  update_type = sums_type.update

  @tff.tensorflow.computation(sums_type)
  def weighted_mean(sums):
    return tf.nest.map_structure(
        lambda t: tf.math.divide_no_nan(t, sums['weight']), sums['update'])

  @tff.tensorflow.computation(weights_type, update_type)
  def apply_update(weights, update):
    return client_outputs.apply_update(weights, update)

  @tff.tensorflow.computation(update_type, update_type, np.int32)
  def score(normalized, aggregate, index):
    phi = cosine(normalized, aggregate)
    if not client_context:  # Nobody to attribute the cosine to.
      return phi, collections.OrderedDict(phis=tf.zeros([num_clients]),
                                          participants=tf.zeros([num_clients]))
    return phi, collections.OrderedDict(
        phis=client_outputs.one_hot_sum(index, phi, num_clients),
        participants=client_outputs.one_hot_sum(index, 1.0, num_clients))

  scores_type = score.type_signature.result[1]

  @tff.tensorflow.computation(reputation_type, scores_type)
  def next_reputations(reputation_state, scores):
    if client_context:
      reputations = update_reputations(
          reputation_state['reputations'], scores['phis'],
          scores['participants'], alpha)
      shares = reward_shares(reputations, beta)
    else:  # Nobody identified: no reputation, everyone gets everything.
      reputations = reputation_state['reputations']
      shares = tf.ones([num_clients])
    return collections.OrderedDict(
        reputations=reputations,
        round_num=reputation_state['round_num'] + 1), shares

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
                              np.float32)
  def receive(own_model, received, phi):
    reward = fed_avg.first_element(received)
    return collections.OrderedDict(
        model=client_outputs.apply_update(own_model, reward['update']),
        phi=phi, reputation=reward['reputation'], reward=reward['reward'])

  @tff.tensorflow.computation
  def initial_reputations():
    return collections.OrderedDict(reputations=tf.zeros([num_clients]),
                                   round_num=tf.constant(0))

  aggregate_metrics = fed_avg.metrics_aggregation(model_fn,
                                                  metrics_aggregator)
  initialize = client_outputs.build_initialize(
      model_fn, aggregator_fn=initial_reputations)

  def round_fn(state, client_data):
    sums, normalized, index, local_metrics = tff.federated_map(
        client_update, (tff.federated_broadcast(state.global_model_weights),
                        tff.federated_broadcast(state.aggregator),
                        client_data))
    aggregate = tff.federated_map(weighted_mean, tff.federated_sum(sums))
    new_weights = tff.federated_map(
        apply_update, (state.global_model_weights, aggregate))
    phi, scores = tff.federated_map(
        score, (normalized, tff.federated_broadcast(aggregate), index))
    scores = tff.federated_sum(scores)
    reputation_state, shares = tff.federated_map(
        next_reputations, (state.aggregator, scores))
    reward = tff.federated_zip(collections.OrderedDict(
        aggregate=aggregate, reputations=reputation_state.reputations,
        shares=shares))
    # Each client gets only its own sparsified aggregate, chosen by its
    # index (without context: index 0 and share 1 for all, the whole).
    received = client_outputs.select_by_index(index, num_clients, reward,
                                              select_reward)
    own_models = (client_data.model if client_context
                  else tff.federated_broadcast(state.global_model_weights))
    clients = tff.federated_map(receive, (own_models, received, phi))
    new_state = client_outputs.next_state(state, new_weights,
                                          aggregator=reputation_state)
    metrics = client_outputs.round_metrics(
        aggregate_metrics(local_metrics),
        collections.OrderedDict(
            phis=scores.phis, participants=scores.participants,
            reputations=reputation_state.reputations, rewards=shares))
    return new_state, metrics, clients

  return client_outputs.build_process(initialize, round_fn, input_type)
