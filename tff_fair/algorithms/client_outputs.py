"""Learning processes that also hand per-client values back to the driver.

TFF 0.87's `LearningProcess` refuses a `next` whose result holds anything
placed at the clients: it must be `<state=S@SERVER, metrics=M@SERVER>`.
Some algorithms must give their driver per-client values every round:
training-time Aequa each client's update on the minimum-width sub-network
(the contribution tracker scores it in Python), CGSV and IAFL each client's
own model (kept between rounds outside TFF, like Ditto's personal models).
Computing them in a second computation would train every client twice, so
such a process traces one round function into two computations:

    next:                     (<S@SERVER, {C}@CLIENTS> ->
                               <state=S@SERVER, metrics=M@SERVER>)
    next_with_client_outputs: (<S@SERVER, {C}@CLIENTS> ->
                               <state=S@SERVER, metrics=M@SERVER,
                                clients={O}@CLIENTS>)

Both run the same round: the same state and metrics from the same inputs;
`next` drops the clients' values. So the process runs wherever a
`LearningProcess` does (`tff.learning.programs.train_model`,
`tff.simulation.run_training_process`, a loop of your own), and a driver
that needs the values calls `next_with_client_outputs`. That needs a
context returning CLIENTS-placed values: TFF's local runtime (and
`tff_fair.runtime`) does, `tff.program.NativeFederatedContext` does not.
The local runtime returns `clients` as a list in the order of the inputs.

Processes whose clients each hold their own model (CGSV, IAFL) take it in
the client input (`model_client_input`); `ClientModels` keeps them in
memory between rounds for a loop of your own.
"""

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import training_loop
from tff_fair.algorithms import update_attacks

RoundFn = Callable[[Any, Any], tuple[Any, Any, Any]]


class RoundOutput(NamedTuple):
  """The result of `next_with_client_outputs`.

  Attributes:
    state: The new server state.
    metrics: The round's metrics (server-placed).
    clients: Each client's values (a list, in input order, when run).
  """

  state: Any
  metrics: Any
  clients: Any


class ProcessWithClientOutputs(tff.learning.templates.LearningProcess):
  """A `LearningProcess` plus `next_with_client_outputs` (module docstring).

  Attributes:
    next_with_client_outputs: The round, also returning the clients' values.
  """

  def __init__(self, initialize_fn: tff.Computation,
               next_with_client_outputs_fn: tff.Computation,
               get_model_weights_fn: tff.Computation,
               set_model_weights_fn: tff.Computation):
    state_type, clients_type = (
        next_with_client_outputs_fn.type_signature.parameter)

    @tff.federated_computation(state_type, clients_type)
    def next_fn(state, clients):
      output = next_with_client_outputs_fn(state, clients)
      return tff.learning.templates.LearningProcessOutput(
          output.state, output.metrics)

    super().__init__(initialize_fn, next_fn, get_model_weights_fn,
                     set_model_weights_fn)
    self._next_with_client_outputs = next_with_client_outputs_fn

  @property
  def next_with_client_outputs(self) -> tff.Computation:
    return self._next_with_client_outputs


def build_process(
    initialize_fn: tff.Computation,
    round_fn: RoundFn,
    client_input_type: Any,
) -> ProcessWithClientOutputs:
  """Traces `round_fn` into a `ProcessWithClientOutputs`.

  Args:
    initialize_fn: `( -> S@SERVER)`; S must be a
      `tff.learning.templates.LearningAlgorithmState` (its
      `global_model_weights` are the process's model weights).
    round_fn: `(state, client_inputs) -> (state, metrics, clients)` on
      federated values (server, server, clients), called while tracing.
    client_input_type: One client's input type (unplaced).

  Returns:
    The process.
  """
  state_type = initialize_fn.type_signature.result

  @tff.federated_computation(
      state_type, tff.FederatedType(client_input_type, tff.CLIENTS))
  def next_with_client_outputs(state, client_inputs):
    return RoundOutput(*round_fn(state, client_inputs))

  state_member = state_type.member

  @tff.tensorflow.computation(state_member)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_member,
                              state_member.global_model_weights)
  def set_model_weights(state, weights):
    return tff.learning.templates.LearningAlgorithmState(
        global_model_weights=weights, distributor=state.distributor,
        client_work=state.client_work, aggregator=state.aggregator,
        finalizer=state.finalizer)

  return ProcessWithClientOutputs(initialize_fn, next_with_client_outputs,
                                  get_model_weights, set_model_weights)


def check_num_clients(num_clients) -> None:
  """Raises `ValueError` unless `num_clients` is an int >= 1."""
  if isinstance(num_clients, bool) or not isinstance(
      num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f'num_clients must be an int >= 1, got {num_clients!r}.')


def build_initialize(
    model_fn,
    aggregator_fn: Optional[tff.Computation] = None,
    finalizer: Optional[tff.learning.templates.FinalizerProcess] = None,
) -> tff.Computation:
  """`( -> S@SERVER)`: a fresh model in a `LearningAlgorithmState`.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    aggregator_fn: No-arg TF computation of the aggregation's initial state
      (e.g. CGSV's reputations); default `()`.
    finalizer: A finalizer process whose `initialize` gives the finalizer's
      state; default `()`.
  """

  @tff.tensorflow.computation
  def initial_weights():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  @tff.federated_computation()
  def initialize():
    empty = tff.federated_value((), tff.SERVER)
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=tff.federated_eval(initial_weights, tff.SERVER),
        distributor=empty, client_work=empty,
        aggregator=(empty if aggregator_fn is None
                    else tff.federated_eval(aggregator_fn, tff.SERVER)),
        finalizer=empty if finalizer is None else finalizer.initialize()))

  return initialize


def next_state(state, weights, aggregator=None, finalizer=None):
  """The round's new state (a federated value); other parts are kept."""
  return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
      global_model_weights=weights, distributor=state.distributor,
      client_work=state.client_work,
      aggregator=state.aggregator if aggregator is None else aggregator,
      finalizer=state.finalizer if finalizer is None else finalizer))


def round_metrics(train, aggregator, **more):
  """`<client_work=<train=...>, aggregator=..., **more>@SERVER`.

  The layout of `compose_learning_process`'s metrics, so drivers read the
  training metrics at `client_work/train` whatever the process.
  """
  return tff.federated_zip(collections.OrderedDict(
      client_work=collections.OrderedDict(train=train),
      aggregator=aggregator, **more))


def select_by_index(index, num_clients: int, server_value,
                    select_fn: tff.Computation):
  """Each client's own part of a server value, chosen by its index.

  `tff.federated_select` with one key per client: the server runs
  `select_fn(server_value, index)` for each client and sends only that.
  The local runtime rebuilds the selected element with its mapping keys
  sorted, so `select_fn` must return them in sorted order.

  Args:
    index: `{int32}@CLIENTS`, the clients' indices.
    num_clients: The number of indices.
    server_value: The value at the server.
    select_fn: `(server value, int32) -> T`, a TF computation.

  Returns:
    `{T*}@CLIENTS`: one-element data sets (`fed_avg.first_element`).
  """

  @tff.tensorflow.computation(np.int32)
  def keys_of(client):
    return tf.reshape(client, [1])

  return tff.federated_select(
      tff.federated_map(keys_of, index),
      tff.federated_value(np.int32(num_clients), tff.SERVER), server_value,
      select_fn)


def train_own_model(model_fn, optimizer, client_data, client_context: bool,
                    global_weights,
                    client_weighting: fed_avg.ClientWeighting):
  """Local training of a client that holds its own model, in a graph.

  Under client context the client starts from its own model (its input's
  `model`), else from the global model.

  Returns:
    `(attack spec or None, training result, update, weight)` as
    `fed_avg.read_client_input` and `fed_avg.update_and_weight` give them.
  """
  start = client_data['model'] if client_context else global_weights
  data, spec, _ = fed_avg.read_client_input(
      client_data, client_context, start, derive_seed=False)
  trained = training_loop.build_training_loop(model_fn(), optimizer)(
      start, data)
  update, weight = fed_avg.update_and_weight(start, trained, spec,
                                             client_weighting)
  return spec, trained, update, weight


def model_client_input(
    dataset: tf.data.Dataset,
    model: tff.learning.models.ModelWeights,
    attack: Optional[collections.OrderedDict] = None,
    **extra,
) -> collections.OrderedDict:
  """One client's input to a process whose clients hold their own model.

  Args:
    dataset: The client's batched data set.
    model: The client's own model (the global model when it has none yet).
    attack: Its `update_attacks.attack_spec`; the spec's client index
      identifies the client to the server (default `no_attack()`, index 0).
    **extra: Further fields of the process's input (e.g. IAFL's
      `contribution`).

  Returns:
    `OrderedDict(data, attack, model, **extra)`.
  """
  return collections.OrderedDict(
      **fed_avg.client_input(dataset, attack), model=model, **extra)


def apply_update(weights, update) -> tff.learning.models.ModelWeights:
  """`weights` moved by an update of TFF's sign (`initial - trained`).

  Non-trainable weights are kept. Works on any structures with the
  trainable weights' leaves in order (lists and tuples alike).
  """
  return tff.learning.models.ModelWeights(
      trainable=tf.nest.pack_sequence_as(weights.trainable, [
          w - u for w, u in zip(tf.nest.flatten(weights.trainable),
                                tf.nest.flatten(update))]),
      non_trainable=weights.non_trainable)


def client_index(spec, num_clients: int) -> tf.Tensor:
  """The client index of an attack spec (its seed's second half), checked.

  The driver puts each client's index in `[0, num_clients)` there
  (`update_attacks.attack_spec`); an index outside fails the computation
  rather than silently reading another client's entry.
  """
  index = spec['seed'][1]
  with tf.control_dependencies([
      tf.debugging.assert_non_negative(
          index, message='A client index must be >= 0.'),
      tf.debugging.assert_less(
          index, num_clients,
          message=f'A client index must be < num_clients={num_clients}.'),
  ]):
    return tf.identity(index)


def one_hot_sum(index, value, num_clients: int) -> tf.Tensor:
  """`value` at position `index` of a float32[num_clients] vector of zeros.

  Summed over clients (`tff.federated_sum`), it gathers one scalar per
  client at the server, by client index.
  """
  return tf.one_hot(index, num_clients, dtype=tf.float32) * tf.cast(
      value, tf.float32)


class ClientModels:
  """Each client's own model, in memory, for a loop of your own.

  For processes whose clients hold their own model (CGSV, IAFL): a round
  gives each sampled client its model (the global model of the state the
  first time it is sampled), runs `next_with_client_outputs` and keeps the
  models it returns. Clients are identified by their index in
  `[0, num_clients)`, which the process reads from the attack spec.

      models = client_outputs.ClientModels(process)
      state = process.initialize()
      for round_num in range(rounds):
        indices = sample(range(num_clients))
        output = models.round(state, indices, [datasets[i] for i in indices],
                              round_seed=round_num)
        state = output.state
  """

  def __init__(self, process: ProcessWithClientOutputs,
               initial: Optional[Mapping[int, Any]] = None):
    self._process = process
    self._models = dict(initial or {})

  def __getitem__(self, index: int) -> tff.learning.models.ModelWeights:
    return self._models[index]

  def __contains__(self, index: int) -> bool:
    return index in self._models

  def get(self, index: int, state: Any) -> tff.learning.models.ModelWeights:
    """Client `index`'s model, or the global model of `state`."""
    if index in self._models:
      return self._models[index]
    return self._process.get_model_weights(state)

  def round(
      self,
      state: Any,
      indices: Sequence[int],
      datasets: Sequence[tf.data.Dataset],
      round_seed: int = 0,
      attacks: Optional[Sequence[collections.OrderedDict]] = None,
      extras: Optional[Sequence[Mapping[str, Any]]] = None,
  ) -> RoundOutput:
    """One round of `indices` on `datasets`; keeps the returned models.

    Args:
      state: The server state before the round.
      indices: The round's clients (indices into `[0, num_clients)`).
      datasets: Their batched data sets, in the same order.
      round_seed: Seeds the clients' randomness (with their indices) when
        `attacks` is not given.
      attacks: Their attack specs (default: none; their seeds must carry
        the clients' indices).
      extras: Per-client further input fields (e.g. IAFL's contribution).

    Returns:
      `next_with_client_outputs`'s `RoundOutput`.
    """
    if len(indices) != len(datasets):
      raise ValueError(f'{len(indices)} client indices for {len(datasets)}'
                       ' data sets.')
    if len(set(indices)) != len(indices):
      raise ValueError(f'Client indices repeat: {list(indices)}.')
    if attacks is None:
      attacks = [update_attacks.no_attack(seed=round_seed, client_index=i)
                 for i in indices]
    extras = extras or [{}] * len(indices)
    inputs = [model_client_input(ds, self.get(i, state), spec, **extra)
              for i, ds, spec, extra in zip(indices, datasets, attacks,
                                            extras)]
    output = self._process.next_with_client_outputs(state, inputs)
    for i, values in zip(indices, output.clients):
      self._models[i] = as_model_weights(values['model'])
    return output


def as_model_weights(weights) -> tff.learning.models.ModelWeights:
  """Numpy `ModelWeights` of a returned model (`ModelWeights` or mapping)."""
  if isinstance(weights, Mapping):
    trainable, non_trainable = weights['trainable'], weights['non_trainable']
  else:
    trainable, non_trainable = weights.trainable, weights.non_trainable
  return tff.learning.models.ModelWeights(
      trainable=[np.asarray(t) for t in trainable],
      non_trainable=[np.asarray(t) for t in non_trainable])
