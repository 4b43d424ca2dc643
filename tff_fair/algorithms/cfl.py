"""Clustered FL (Sattler, Mueller, Samek, IEEE TNNLS 2020): a model per cluster.

Clients whose data differ in kind (e.g. rotated images, permuted labels)
pull one model in incompatible directions. Clustered FL starts with one
cluster of every client, trains it as FedAvg does, and splits a cluster in
two when its clients' updates show it has reached a stationary point that
some of them are far from; each sub-cluster then trains its own model.
Clients are told apart by the cosine similarity of their updates. The
server's decisions (placements, the split criterion, complete linkage) are
`tff_fair.algorithms.clustering`'s, in numpy; this module trains the
clusters in TFF and applies the decisions to its state.

State. TFF types are static, so the server state holds a fixed number of
cluster slots: K = 2 * max_clusters - 1 models, the nodes of the tree of
splits (`clustering`). Slot 0 is the root cluster; a split of cluster c
fills the next two free slots with copies of c's model. The membership
(which slot each client sits at), each slot's parent and split round, and
each sub-cluster's direction (its members' mean update in the split round,
which places clients later) are state too, so the clusters are
checkpointed with the models, in one piece:

    S = <slots=<trainable=[float32[K, ...]], non_trainable=[...]>,
         directions=[float32[K, ...]], membership=int32[N],
         parent=int32[K], split_round=int32[K], round_num=int32>

with N = num_clients. The process's model (`get_model_weights`) is the
root's: the one model of the federation until the first split, then kept
as it was then (the reference's "FL model", which the clusters improve
on).

A round (`next_with_client_outputs`):

1. Each client receives only the model of the slot it sits at, selected by
   its index (`tff.federated_select`), and trains from it.
2. The server sums each client's weighted update into its slot
   (`tff.federated_aggregate`), if that slot is a leaf: a client at an
   inner slot (not placed yet) trains only to be placed.
3. Each slot moves by its weighted mean update times
   `server_learning_rate` (plain SGD, the paper's rule; a slot without
   updates keeps its model).

It returns each client's `<index, slot, leaf, update, weight>` beside the
state and metrics. Between rounds `split_and_place` (or the whole round,
`next_with_splits`) places the clients sampled at inner slots and splits
the clusters that meet the criterion, a pure function of the state and
those values, applied to the state before it is checkpointed. A split
takes effect from the next round: both sub-clusters start from the
cluster's model after the split round, which averaged all its members (the
paper already applies each sub-cluster's own mean update in that round; at
a split the cluster's mean update is below eps1 by the criterion).

Clients not placed. A client that was not sampled when its cluster split
(and, after the root's first split, a client never sampled) stays at the
inner slot and uses its model, kept as it was at the split: the root model
for a client never sampled. When next sampled it trains from that model and
moves, by that first update, to the sub-cluster whose direction is nearer
(cosine), one level of the tree per round, as the paper places new clients
by its parameter tree.

Type signatures (`client_outputs`):

    initialize: ( -> S@SERVER)
    next: (<S@SERVER, {C}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER>)
    next_with_client_outputs: (<S@SERVER, {C}@CLIENTS> ->
        <state=S@SERVER, metrics=M@SERVER, clients={O}@CLIENTS>)
    C = D* (plain) or <data=D*, attack=A*> (`fed_avg.client_input`)
    O = <index=int32, slot=int32, leaf=bool, update=U, weight=float32>
    M = <client_work=<train=T>>

Without client context (plain data sets, TFF's default) the server cannot
tell clients apart: every client trains from the root model, which moves by
the weighted mean of all updates, `index` is -1 and no client can be placed
in a cluster (`split_and_place` refuses): the root cluster never splits and
CFL is FedAvg.
"""

import collections
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import clustering
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import training_loop

# The client index of a client without context (nobody is identified).
NO_INDEX = -1


def _check_arguments(num_clients, max_clusters, server_learning_rate) -> None:
  client_outputs.check_num_clients(num_clients)
  clustering.num_slots(max_clusters)  # Checks it.
  if not (np.isfinite(server_learning_rate) and server_learning_rate > 0):
    raise ValueError('server_learning_rate must be a finite number > 0, got'
                     f' {server_learning_rate}.')


def build_cfl(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    num_clients: int,
    max_clusters: int = 4,
    server_learning_rate: float = 1.0,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    metrics_aggregator: fed_avg.MetricsAggregator = None,
    client_context: bool = False,
) -> client_outputs.ProcessWithClientOutputs:
  """Builds clustered FL's training of the clusters (module docstring).

  `next` and `next_with_client_outputs` take `{C}@CLIENTS` with C = D* by
  default and `<data=D*, attack=A*>` under `client_context`; splits come
  from `split_and_place` between rounds.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer_fn: Local optimizer.
    num_clients: How many clients there are; client indices (in the
      attack specs) lie in [0, num_clients).
    max_clusters: The most clusters there can be; the state holds
      2 * max_clusters - 1 models and as many directions (1: FedAvg).
    server_learning_rate: Each cluster moves by its mean update times this.
    client_weighting: Weights of the means: `NUM_EXAMPLES` (default, the
      paper's) or `UNIFORM` (the reference code's).
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    client_context: Client identities, hence clusters (module docstring).

  Returns:
    A `client_outputs.ProcessWithClientOutputs`.

  Raises:
    ValueError: For num_clients or max_clusters < 1, or a server learning
      rate that is not a finite number > 0.
  """
  _check_arguments(num_clients, max_clusters, server_learning_rate)
  fed_avg.check_client_weighting(client_weighting)
  slots = clustering.num_slots(max_clusters)
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  input_type = fed_avg.client_input_type(model_fn, client_context)

  def stacked(tensors, fill):
    """[K, ...] per tensor: the tensor in slot 0, `fill` elsewhere."""
    return [tf.concat([t[None], tf.fill([slots - 1, *t.shape], fill(t))], 0)
            for t in tensors]

  @tff.tensorflow.computation
  def initialize_state():
    weights = tff.learning.models.ModelWeights.from_model(model_fn())
    zero = lambda t: tf.zeros([], t.dtype)
    return collections.OrderedDict(
        slots=collections.OrderedDict(
            trainable=stacked(weights.trainable, zero),
            non_trainable=stacked(weights.non_trainable, zero)),
        directions=[tf.zeros([slots, *t.shape], t.dtype)
                    for t in weights.trainable],
        membership=tf.zeros([num_clients], tf.int32),
        parent=tf.fill([slots], clustering.NO_PARENT),
        split_round=tf.concat(
            [[0], tf.fill([slots - 1], clustering.UNUSED)], 0),
        round_num=tf.constant(0))

  state_type = initialize_state.type_signature.result

  @tff.tensorflow.computation(input_type)
  def key_of(client_data):
    if not client_context:  # Nobody is identified: every client reads 0.
      return tf.constant(0)
    return client_outputs.client_index(
        fed_avg.first_element(client_data['attack']), num_clients)

  @tff.tensorflow.computation(state_type)
  def selectable(state):
    return collections.OrderedDict(
        slots=state['slots'], membership=state['membership'],
        parent=state['parent'])

  @tff.tensorflow.computation(selectable.type_signature.result, np.int32)
  def select_slot(value, index):
    # Without context every client is at the root.
    slot = (tf.gather(value['membership'], index) if client_context
            else tf.constant(0))
    pick = lambda tensors: [tf.gather(t, slot) for t in tensors]
    # tf.equal, not ==: in TFF's graphs == compares the tensors' identity.
    return collections.OrderedDict(  # Keys sorted: `select_by_index`.
        leaf=tf.logical_not(tf.reduce_any(tf.equal(value['parent'], slot))),
        non_trainable=pick(value['slots']['non_trainable']), slot=slot,
        trainable=pick(value['slots']['trainable']))

  selected_type = tff.SequenceType(select_slot.type_signature.result)

  @tff.tensorflow.computation(selected_type, input_type)
  def client_update(selected, client_data):
    chosen = fed_avg.first_element(selected)
    # A selected element's lists come back as tuples; the model's are lists.
    start = tff.learning.models.ModelWeights(
        trainable=list(chosen['trainable']),
        non_trainable=list(chosen['non_trainable']))
    data, spec, _ = fed_avg.read_client_input(
        client_data, client_context, start, derive_seed=False)
    trained = training_loop.build_training_loop(
        model_fn(), client_optimizer_fn)(start, data)
    update, weight = fed_avg.update_and_weight(start, trained, spec,
                                               client_weighting)
    index = (client_outputs.client_index(spec, num_clients) if client_context
             else tf.constant(NO_INDEX))
    return (collections.OrderedDict(index=index, slot=chosen['slot'],
                                    leaf=chosen['leaf'], update=update,
                                    weight=weight),
            trained['metrics'])

  sent_type = client_update.type_signature.result[0]

  @tff.tensorflow.computation
  def zeros():
    return collections.OrderedDict(
        updates=[tf.zeros([slots, *t.shape], t.dtype)
                 for t in weights_type.trainable],
        weights=tf.zeros([slots]))

  sums_type = zeros.type_signature.result

  @tff.tensorflow.computation(sums_type, sent_type)
  def accumulate(sums, sent):
    # Only a leaf trains: an update at an inner slot only places its client.
    weight = tf.where(sent['leaf'], sent['weight'], 0.0)
    at = [[sent['slot']]]
    return collections.OrderedDict(
        updates=[tf.tensor_scatter_nd_add(rows, at, (weight * u)[None])
                 for rows, u in zip(sums['updates'],
                                    tf.nest.flatten(sent['update']))],
        weights=tf.tensor_scatter_nd_add(sums['weights'], at, weight[None]))

  @tff.tensorflow.computation(sums_type, sums_type)
  def merge(a, b):
    return tf.nest.map_structure(tf.add, a, b)

  @tff.tensorflow.computation(sums_type)
  def report(sums):
    return sums

  @tff.tensorflow.computation(state_type, sums_type)
  def server_update(state, sums):
    weights = sums['weights']

    def step(models, total):
      mean = tf.math.divide_no_nan(
          total, tf.reshape(weights, [-1] + [1] * (total.shape.rank - 1)))
      return models - server_learning_rate * mean

    new_state = collections.OrderedDict(state)
    new_state['slots'] = collections.OrderedDict(
        trainable=[step(m, t) for m, t in zip(state['slots']['trainable'],
                                              sums['updates'])],
        non_trainable=state['slots']['non_trainable'])
    new_state['round_num'] = state['round_num'] + 1
    return new_state

  aggregate_metrics = fed_avg.metrics_aggregation(model_fn,
                                                  metrics_aggregator)

  @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                             tff.FederatedType(input_type, tff.CLIENTS))
  def next_with_client_outputs(state, client_data):
    selected = client_outputs.select_by_index(
        tff.federated_map(key_of, client_data), num_clients,
        tff.federated_map(selectable, state), select_slot)
    sent, local_metrics = tff.federated_map(client_update,
                                            (selected, client_data))
    sums = tff.federated_aggregate(sent, zeros(), accumulate, merge, report)
    new_state = tff.federated_map(server_update, (state, sums))
    metrics = tff.federated_zip(collections.OrderedDict(
        client_work=tff.federated_zip(collections.OrderedDict(
            train=aggregate_metrics(local_metrics)))))
    return client_outputs.RoundOutput(new_state, metrics, sent)

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return tff.learning.models.ModelWeights(
        trainable=[t[0] for t in state['slots']['trainable']],
        non_trainable=[t[0] for t in state['slots']['non_trainable']])

  @tff.tensorflow.computation(state_type, weights_type)
  def set_model_weights(state, weights):
    def at_root(models, tensors):
      return [tf.tensor_scatter_nd_update(m, [[0]], t[None])
              for m, t in zip(models, tensors)]

    new_state = collections.OrderedDict(state)
    new_state['slots'] = collections.OrderedDict(
        trainable=at_root(state['slots']['trainable'], weights.trainable),
        non_trainable=at_root(state['slots']['non_trainable'],
                              weights.non_trainable))
    return new_state

  @tff.federated_computation()
  def initialize():
    return tff.federated_eval(initialize_state, tff.SERVER)

  return client_outputs.ProcessWithClientOutputs(
      initialize, next_with_client_outputs, get_model_weights,
      set_model_weights)


def _flat(tensors) -> np.ndarray:
  """float64[d]: a structure of arrays, flattened in order."""
  return np.concatenate([np.ravel(t) for t in tf.nest.flatten(tensors)]
                        ).astype(np.float64)


def update_norm(update) -> float:
  """The norm of a client's update (all its tensors together)."""
  return float(np.linalg.norm(_flat(update)))


def split_and_place(
    state: Any, clients: Sequence[Any], rule: clustering.SplitRule,
) -> tuple[Any, clustering.Decisions]:
  """The state after the server's decisions on a round (module docstring).

  Args:
    state: The state `next_with_client_outputs` returned.
    clients: Its clients' values, in any order.
    rule: The split criterion.

  Returns:
    (a new state: clients placed, clusters split, each sub-cluster with a
    copy of its parent's model and its direction; the decisions).

  Raises:
    ValueError: For values of a process without client context.
  """
  clients = list(clients)
  if any(int(c['index']) == NO_INDEX for c in clients):
    raise ValueError('Clustered FL tells clients apart by their index: build'
                     ' the process with client_context=True.')
  trainable = state['directions']
  directions = np.concatenate(
      [np.reshape(t, [len(t), -1]) for t in trainable], axis=1)
  decisions = clustering.decide(
      state['parent'], state['split_round'], directions,
      [clustering.ClientUpdate(int(c['index']), int(c['slot']),
                               _flat(c['update']), float(c['weight']))
       for c in clients],
      int(state['round_num']), rule)
  new = tf.nest.map_structure(np.array, state)  # A deep copy.
  membership, parent, split_round = clustering.apply(
      state['membership'], state['parent'], state['split_round'], decisions,
      int(state['round_num']))
  new['membership'][...] = membership
  new['parent'][...] = parent
  new['split_round'][...] = split_round
  sizes = [int(np.prod(t.shape[1:])) for t in trainable]
  for cluster in decisions.splits:
    for child in cluster.children:
      for models in tf.nest.flatten(new['slots']):
        models[child] = models[cluster.cluster]
      parts = np.split(decisions.directions[child], np.cumsum(sizes)[:-1])
      for layer, part in zip(new['directions'], parts):
        layer[child] = part.reshape(layer.shape[1:])
  return new, decisions


def next_with_splits(
    process: client_outputs.ProcessWithClientOutputs, state: Any,
    client_inputs: Sequence[Any], rule: clustering.SplitRule,
) -> tuple[client_outputs.RoundOutput, clustering.Decisions]:
  """A whole round of clustered FL: `next_with_client_outputs`, then
  `split_and_place` (for a loop of your own).

  Returns:
    (the round's output with the state after the decisions, the decisions).
  """
  output = process.next_with_client_outputs(state, client_inputs)
  new_state, decisions = split_and_place(output.state, output.clients, rule)
  return output._replace(state=new_state), decisions


def slot_weights(state: Any,
                 slot: int) -> tff.learning.models.ModelWeights:
  """The model of one slot of `state` (numpy)."""
  slots = state['slots']
  return tff.learning.models.ModelWeights(
      trainable=[np.asarray(t[slot]) for t in slots['trainable']],
      non_trainable=[np.asarray(t[slot]) for t in slots['non_trainable']])


def client_weights(state: Any) -> Callable[[int], tff.learning.models.
                                           ModelWeights]:
  """Client index -> the model it uses: that of the slot it sits at."""
  membership = np.asarray(state['membership'])
  return lambda index: slot_weights(state, int(membership[index]))


def clusters(state: Any) -> list[int]:
  """The slots that train (leaves of the tree of splits), in order."""
  return clustering.leaves(state['parent'], state['split_round'])


def cluster_members(state: Any) -> dict[int, list[int]]:
  """Slot -> the indices of the clients at it (inner slots too)."""
  members = collections.defaultdict(list)
  for index, slot in enumerate(np.asarray(state['membership']).tolist()):
    members[slot].append(index)
  return dict(members)


def client_input(dataset: tf.data.Dataset,
                 attack: Optional[collections.OrderedDict] = None
                 ) -> collections.OrderedDict:
  """One client's input under `client_context` (`fed_avg.client_input`);
  the attack spec's client index identifies it."""
  return fed_avg.client_input(dataset, attack)
