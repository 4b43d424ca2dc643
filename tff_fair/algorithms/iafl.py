"""IAFL: training-time model rewards by sharing (Wu et al., ICLR 2024).

A baseline of Aequa. Every client holds its own model, and a client that
contributes more gets more of the others' updates. A round:

1. Client i trains from its own model and sends its update u_i, its
   weight w_i (`client_weighting`: examples by default) and its
   contribution p_i (its examples by default, or a value it is given, e.g.
   standalone accuracy: `contribution_input=True`).
2. The server computes gamma_i = p_i / max_j p_j over the round's n
   clients and k_i = ceil(gamma_i^(1 - kappa) (n - 1)), then draws for
   client i k_i of the other n - 1 clients uniformly at random (seeded by
   `seed` and the round). Client i's aggregate is the weighted mean (w) of
   its own update and the chosen clients' updates, and its model moves by
   it. kappa in [0, 1] sets how much is shared: kappa = 1 gives everyone
   all the updates, kappa = 0 makes k_i proportional to gamma_i.
3. The server model moves by the weighted mean of all the round's updates
   (FedAvg's step: `model_aggregator` and the server optimizer, by
   default the plain weighted mean applied at rate 1).
4. Optional stochastic reset: with probability `reset_probability` (per
   client and round, seeded) a client's model is replaced by the new server
   model instead.

(Updates follow TFF's sign, `initial - trained`, so applying one is a
subtraction.) k_i is computed in float64 with a tolerance of 1e-9, so
float rounding never adds a client (gamma^(1 - kappa) (n - 1) = 2 stays 2).
A contribution below 0 counts as 0; if none is above 0, k_i = 0 for all.

Identity and per-client models. The server must know which update is whose
to send each client its own mixture, and every client trains its own
model, so both need the client context (`client_context=True`): each
client's input is `client_input(dataset, model, attack_spec)`,
`<data=D*, attack=A*, model=W>` (plus `contribution=float32` with
`contribution_input`), and the spec's client index in [0, num_clients)
identifies it. The server gathers the round's updates by index
(`tff.federated_aggregate`), mixes them, and each client receives only its
own mixture (`tff.federated_select`). The new models are per-client
values, which `next` (a `LearningProcess`'s) cannot return:
`next_with_client_outputs` (`client_outputs`) returns them, and the
driver keeps them (`client_outputs.ClientModels` in memory). A client's
reset needs the new server model: it is broadcast to every client.

Without client context (plain data sets, TFF's default) the server cannot
address a client: every client trains from the server model, the server
model moves by FedAvg's weighted mean, and every client's model is the
new server model (no mixtures, no resets): IAFL reduces to FedAvg.

Type signatures (`client_outputs`):

    initialize: ( -> S@SERVER)
    next: (<S@SERVER, {C}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER>)
    next_with_client_outputs: (<S@SERVER, {C}@CLIENTS> ->
        <state=S@SERVER, metrics=M@SERVER, clients={O}@CLIENTS>)
    C = D* (plain) or <data=D*, attack=A*, model=W[, contribution=float32]>
    S.client_work = <round_num=int32>
    O = <model=W, chosen=float32[N], k=int32, reset=bool>
    M = <distributor=(), client_work=<train=T>, aggregator=the model
         aggregator's, finalizer=the server optimizer's,
         reward=<participants=float32[N], contributions=float32[N],
                 k=int32[N], resets=float32[N]>>

with N = num_clients; `chosen` is 1 at the clients whose updates client i
received besides its own. Without context M's vectors are zeros (nobody
is identified).
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

# Streams folded into the round's seed, one per draw.
_SELECTION_STREAM = 1
_RESET_STREAM = 2


def client_input(
    dataset: tf.data.Dataset,
    model: tff.learning.models.ModelWeights,
    attack: Optional[collections.OrderedDict] = None,
    contribution: Optional[float] = None,
) -> collections.OrderedDict:
  """One client's input under `client_context`.

  Args:
    dataset: The client's batched data set.
    model: The client's own model (the server model when it has none yet).
    attack: Its `update_attacks.attack_spec`, carrying its client index.
    contribution: Its p_i, for a process built with `contribution_input`.
  """
  extra = {} if contribution is None else dict(
      contribution=np.float32(contribution))
  return client_outputs.model_client_input(dataset, model, attack, **extra)


def shared_counts(contributions, participants, kappa: float) -> tf.Tensor:
  """k_i = ceil(gamma_i^(1 - kappa) (n - 1)) (int32[N]; 0 if absent).

  Args:
    contributions: float32[N], p_i (read where participating).
    participants: float32[N], 1 for the round's clients.
    kappa: In [0, 1].
  """
  present = participants > 0
  p = tf.where(present, tf.maximum(tf.cast(contributions, tf.float64), 0.0),
               0.0)
  gamma = tf.math.divide_no_nan(p, tf.reduce_max(p))
  others = tf.reduce_sum(tf.cast(present, tf.float64)) - 1.0
  # 0^0 would be 1: a client that contributed nothing gets nobody.
  powered = tf.where(gamma > 0, tf.pow(gamma, 1.0 - kappa), 0.0)
  k = tf.math.ceil(powered * others - 1e-9)
  return tf.where(present,
                  tf.cast(tf.clip_by_value(k, 0.0, others), tf.int32), 0)


def choose_others(k, participants, seed) -> tf.Tensor:
  """float32[N, N]: row i marks k_i of the other participants, at random.

  Each row ranks the other participants by a uniform draw (stateless,
  `seed`) and keeps the first k_i: a uniformly random subset of size k_i.
  """
  n = tf.shape(participants)[0]
  keys = tf.random.stateless_uniform(tf.stack([n, n]), seed=seed)
  valid = tf.logical_and(participants[None, :] > 0,
                         tf.logical_not(tf.eye(n, dtype=tf.bool)))
  keys = tf.where(valid, keys, 2.0)  # Past every draw: ranked last.
  ranks = tf.argsort(tf.argsort(keys, axis=1), axis=1)
  chosen = tf.logical_and(valid, ranks < k[:, None])
  return tf.cast(chosen, tf.float32)


def round_seed(seed: int, round_num, stream: int) -> tf.Tensor:
  """The stateless seed of one draw of round `round_num`."""
  fold_in = tf.random.experimental.stateless_fold_in
  return fold_in(fold_in(tf.constant([seed, 0], tf.int32),
                         tf.cast(round_num, tf.int32)), stream)


def _check_arguments(num_clients, kappa, reset_probability, client_context,
                     contribution_input) -> None:
  client_outputs.check_num_clients(num_clients)
  for name, value in (('kappa', kappa),
                      ('reset_probability', reset_probability)):
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
      raise ValueError(f'{name} must be in [0, 1], got {value}.')
  if contribution_input and not client_context:
    raise ValueError('contribution_input needs client_context: plain data'
                     ' sets carry no contribution.')


def build_iafl(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    num_clients: int,
    kappa: float = 0.5,
    reset_probability: float = 0.0,
    seed: int = 0,
    contribution_input: bool = False,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    metrics_aggregator: fed_avg.MetricsAggregator = None,
    client_context: bool = False,
) -> client_outputs.ProcessWithClientOutputs:
  """Builds IAFL (see the module docstring).

  TFF's four parts (`client_outputs.compose`) train the server model as
  FedAvg does: a broadcast, client work that trains each client's own
  model, `model_aggregator` of the updates and the server optimizer. After
  the server step each client receives its mixture of the round's updates
  (or a reset to the new server model). `next` and
  `next_with_client_outputs` take `{C}@CLIENTS` with C = D* by default
  and `<data=D*, attack=A*, model=W>` (plus `contribution=float32`) under
  `client_context`; their types are in the module docstring.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer_fn: Local optimizer.
    server_optimizer_fn: The server model's optimizer (of the aggregate, as
      a gradient); default SGD with learning rate 1.0, IAFL's FedAvg step.
    num_clients: How many clients there are; client indices (in the
      attack specs) lie in [0, num_clients).
    kappa: Sharing level in [0, 1] (1: everyone gets every update).
    reset_probability: Probability that a client's model is reset to the
      server model after a round.
    seed: Seeds the choice of the others and the resets (with the round).
    contribution_input: The clients' inputs carry their contribution p_i
      (`client_input(..., contribution=)`); default: their examples.
    client_weighting: Weights of the mixtures and of the server model's
      mean: `NUM_EXAMPLES` (default) or `UNIFORM`.
    model_aggregator: Any `tff.aggregators` factory of the server model's
      updates (default `MeanFactory()`, IAFL's). The mixtures are built
      from the raw updates whatever it is.
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    client_context: Per-client models and identities (module docstring).

  Returns:
    A `client_outputs.ProcessWithClientOutputs`.

  Raises:
    ValueError: For num_clients < 1, kappa or reset_probability outside
      [0, 1], or contribution_input without client_context.
  """
  _check_arguments(num_clients, kappa, reset_probability, client_context,
                   contribution_input)
  fed_avg.check_client_weighting(client_weighting)
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  data_type = training_loop.data_type_of(model_fn)
  extra = {'model': weights_type}
  if contribution_input:
    extra['contribution'] = tff.TensorType(np.float32)
  input_type = (fed_avg.context_type(data_type, **extra) if client_context
                else data_type)

  @tff.tensorflow.computation(weights_type, input_type)
  def client_update(global_weights, client_data):
    spec, trained, update, weight = client_outputs.train_own_model(
        model_fn, client_optimizer_fn, client_data, client_context,
        global_weights, client_weighting)
    if contribution_input:
      contribution = client_data['contribution']
    else:
      contribution = tf.cast(trained['num_examples'], tf.float32)
    # Without context every client lands in row 0: only the totals count.
    index = (client_outputs.client_index(spec, num_clients)
             if client_context else tf.constant(0))
    return (tff.learning.templates.ClientResult(update=update,
                                                update_weight=weight),
            trained['metrics'],
            collections.OrderedDict(index=index, update=update, weight=weight,
                                    contribution=contribution))

  sent_type = client_update.type_signature.result[2]

  @tff.tensorflow.computation
  def zeros():
    return collections.OrderedDict(
        updates=[tf.zeros([num_clients, *t.shape], t.dtype)
                 for t in weights_type.trainable],
        weights=tf.zeros([num_clients]),
        contributions=tf.zeros([num_clients]),
        participants=tf.zeros([num_clients]))

  stacked_type = zeros.type_signature.result

  @tff.tensorflow.computation(stacked_type, sent_type)
  def accumulate(stacked, sent):
    at = [[sent['index']]]

    def add(rows, value):
      return tf.tensor_scatter_nd_add(rows, at, value[None])

    return collections.OrderedDict(
        updates=[add(rows, sent['weight'] * u)
                 for rows, u in zip(stacked['updates'],
                                    tf.nest.flatten(sent['update']))],
        weights=add(stacked['weights'], sent['weight']),
        contributions=add(stacked['contributions'], sent['contribution']),
        participants=add(stacked['participants'], tf.constant(1.0)))

  @tff.tensorflow.computation(stacked_type, stacked_type)
  def merge(a, b):
    return tf.nest.map_structure(tf.add, a, b)

  @tff.tensorflow.computation(stacked_type)
  def report(stacked):
    return stacked

  @tff.tensorflow.computation(stacked_type, np.int32)
  def mixtures(stacked, round_num):
    participants = stacked['participants']
    k = shared_counts(stacked['contributions'], participants, kappa)
    chosen = choose_others(
        k, participants, round_seed(seed, round_num, _SELECTION_STREAM))
    # Own update plus the chosen others', weighted.
    mixing = chosen + tf.linalg.diag(participants)
    total = tf.linalg.matvec(mixing, stacked['weights'])
    mixed = tf.nest.map_structure(
        lambda rows: tf.math.divide_no_nan(
            tf.tensordot(mixing, rows, axes=1),
            tf.reshape(total, [-1] + [1] * (rows.shape.rank - 1))),
        stacked['updates'])
    draws = tf.random.stateless_uniform(
        [num_clients], seed=round_seed(seed, round_num, _RESET_STREAM))
    resets = tf.cast(tf.logical_and(participants > 0,
                                    draws < reset_probability), tf.float32)
    return collections.OrderedDict(chosen=chosen, k=k, mixed=mixed,
                                   resets=resets)

  mixtures_type = mixtures.type_signature.result

  @tff.tensorflow.computation(mixtures_type, np.int32)
  def select_mixture(all_mixtures, index):
    return collections.OrderedDict(  # Keys sorted: `select_by_index`.
        chosen=tf.gather(all_mixtures['chosen'], index),
        k=tf.gather(all_mixtures['k'], index),
        mixed=tf.nest.map_structure(lambda rows: tf.gather(rows, index),
                                    all_mixtures['mixed']),
        reset=tf.gather(all_mixtures['resets'], index) > 0)

  selected_type = select_mixture.type_signature.result

  @tff.tensorflow.computation(weights_type, weights_type,
                              tff.SequenceType(selected_type))
  def receive(own_model, server_model, selected):
    mixture = fed_avg.first_element(selected)
    rewarded = client_outputs.apply_update(own_model, mixture['mixed'])
    model = tf.nest.pack_sequence_as(rewarded, [
        tf.where(mixture['reset'], s, r)
        for s, r in zip(tf.nest.flatten(server_model),
                        tf.nest.flatten(rewarded))])
    return collections.OrderedDict(model=model, chosen=mixture['chosen'],
                                   k=mixture['k'], reset=mixture['reset'])

  @tff.tensorflow.computation(weights_type)
  def as_client_values(server_model):
    return collections.OrderedDict(
        model=server_model, chosen=tf.zeros([num_clients]),
        k=tf.constant(0), reset=tf.constant(False))

  @tff.tensorflow.computation
  def nobody_identified():
    return collections.OrderedDict(
        participants=tf.zeros([num_clients]),
        contributions=tf.zeros([num_clients]),
        k=tf.zeros([num_clients], tf.int32), resets=tf.zeros([num_clients]))

  @tff.tensorflow.computation
  def initial_round():
    return collections.OrderedDict(round_num=tf.constant(0))

  @tff.tensorflow.computation(initial_round.type_signature.result)
  def next_round(counter):
    return collections.OrderedDict(round_num=counter['round_num'] + 1)

  def reward_fn(state, client_data, work, aggregated, finalized):
    del aggregated  # The mixtures are of the raw updates.
    server_model = tff.federated_broadcast(finalized.result)
    if not client_context:
      return (tff.federated_map(as_client_values, server_model),
              tff.federated_eval(nobody_identified, tff.SERVER))
    sent = work.result.outputs
    stacked = tff.federated_aggregate(sent, zeros(), accumulate, merge,
                                      report)
    mixed = tff.federated_map(mixtures,
                              (stacked, state.client_work.round_num))
    # Each client receives only its own mixture, chosen by its index.
    selected = client_outputs.select_by_index(sent.index, num_clients,
                                              mixed, select_mixture)
    clients = tff.federated_map(
        receive, (client_data.model, server_model, selected))
    return clients, tff.federated_zip(collections.OrderedDict(
        participants=stacked.participants,
        contributions=stacked.contributions, k=mixed.k,
        resets=mixed.resets))

  return client_outputs.compose(
      client_outputs.initial_weights_fn(model_fn),
      tff.learning.templates.build_broadcast_process(weights_type),
      # The round counter (the mixtures' seeds) is the client work's state.
      client_outputs.build_client_work(
          client_update,
          fed_avg.metrics_aggregation(model_fn, metrics_aggregator),
          initial_state_fn=initial_round, next_state_fn=next_round),
      fed_avg.build_update_aggregator(model_aggregator, weights_type),
      tff.learning.templates.build_apply_optimizer_finalizer(
          server_optimizer_fn or fed_avg.default_server_optimizer(),
          weights_type),
      reward_fn=reward_fn)
