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
`next` drops the clients' values. `compose` builds such a process from
TFF's four parts (distributor, client work, aggregator, finalizer) with a
client work whose clients also return values, and an optional reward step
after the server step. So the process runs wherever a
`LearningProcess` does (`tff.learning.programs.train_model`,
`tff.simulation.run_training_process`, a loop of your own), and a driver
that needs the values calls `next_with_client_outputs`. That needs a
context returning CLIENTS-placed values: TFF's local runtime (and
`tff_fair.runtime`) does, `tff.program.NativeFederatedContext` does not.
The local runtime returns `clients` as a list in the order of the inputs.

Processes whose clients each hold their own model (CGSV, IAFL) take it in
the client input (`model_client_input`); `ClientModels`, the holder of
per-client models (or parts of models: `tff_fair.models.parts`), keeps them
in memory between rounds for a loop of your own.
"""

import collections
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import training_loop
from tff_fair.algorithms import update_attacks
from tff_fair.models import parts

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


# What a client work's `next` returns at each client: the `ClientResult`
# TFF's aggregators and finalizers take, and the values the process hands
# back to its driver.
CLIENT_RESULT = 'client_result'
OUTPUTS = 'outputs'
# reward_fn(state, client_data, client_work, aggregator, finalizer) ->
# (outputs@CLIENTS, measurements@SERVER or None); see `compose`.
RewardFn = Callable[..., tuple[Any, Any]]


def build_client_work(
    client_update: tff.Computation,
    metrics_aggregation: tff.Computation,
    *,
    summed_outputs: Sequence[str] = (),
    initial_state_fn: Optional[tff.Computation] = None,
    next_state_fn: Optional[tff.Computation] = None,
) -> tff.templates.MeasuredProcess:
  """A client work whose clients also return values for the driver.

  Type signature of `next`:

      (<S@SERVER, {W}@CLIENTS, {C}@CLIENTS> -> <state=S@SERVER,
       result={<client_result=ClientResult, outputs=O>}@CLIENTS,
       measurements=<train=T, **summed>@SERVER>)

  Args:
    client_update: `(W, C) -> <ClientResult, metrics, O>`, a TF computation
      (as `fed_avg.build_client_work`'s, plus O).
    metrics_aggregation: Aggregates the clients' metrics
      (`fed_avg.metrics_aggregation`), released as `train`.
    summed_outputs: Fields of O whose sum over clients is released beside
      `train` (e.g. bytes sent).
    initial_state_fn: No-arg TF computation of the state S (default `()`).
    next_state_fn: `S -> S`, a TF computation run once a round (e.g. a
      round counter); default: S is kept.
  """
  weights_type, data_type = client_update.type_signature.parameter

  @tff.federated_computation()
  def init_fn():
    if initial_state_fn is None:
      return tff.federated_value((), tff.SERVER)
    return tff.federated_eval(initial_state_fn, tff.SERVER)

  state_type = init_fn.type_signature.result

  @tff.federated_computation(state_type,
                             tff.FederatedType(weights_type, tff.CLIENTS),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, weights, client_data):
    client_result, local_metrics, outputs = tff.federated_map(
        client_update, (weights, client_data))
    measurements = collections.OrderedDict(
        train=metrics_aggregation(local_metrics))
    for name in summed_outputs:
      measurements[name] = tff.federated_sum(getattr(outputs, name))
    new_state = (state if next_state_fn is None
                 else tff.federated_map(next_state_fn, state))
    return tff.templates.MeasuredProcessOutput(
        new_state,
        tff.federated_zip(collections.OrderedDict(
            [(CLIENT_RESULT, client_result), (OUTPUTS, outputs)])),
        tff.federated_zip(measurements))

  return tff.templates.MeasuredProcess(init_fn, next_fn)


def initial_weights_fn(model_fn) -> tff.Computation:
  """`compose`'s first part: the model's initial weights, on the server."""

  @tff.tensorflow.computation
  def initial_weights():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return initial_weights


def compose(
    initial_model_weights_fn: tff.Computation,
    model_weights_distributor: tff.learning.templates.DistributionProcess,
    client_work: tff.templates.MeasuredProcess,
    model_update_aggregator: tff.templates.AggregationProcess,
    model_finalizer: tff.learning.templates.FinalizerProcess,
    *,
    reward_fn: Optional[RewardFn] = None,
) -> ProcessWithClientOutputs:
  """`tff.learning.templates.compose_learning_process` with client outputs.

  The same four parts in the same order (distributor, client work,
  aggregator of the `ClientResult`s, finalizer), the same state
  (`LearningAlgorithmState`) and metrics (`<distributor, client_work,
  aggregator, finalizer>`), with a client work from `build_client_work`
  whose clients also return values O. `next_with_client_outputs` hands
  them back:

      next_with_client_outputs: (<S@SERVER, {C}@CLIENTS> ->
          <state=S@SERVER, metrics=M@SERVER, clients={O}@CLIENTS>)

  and `next` is the same round without them. With `reward_fn`, what each
  client gets comes after the server step instead (CGSV's and IAFL's
  rewards: the aggregate, or others' updates, applied to each client's own
  model): `reward_fn(state, client_data, client_work_output,
  aggregator_output, finalizer_output)` is called while tracing, on
  federated values (the old state, the clients' inputs, and the three
  parts' `MeasuredProcessOutput`s) and returns `(outputs@CLIENTS,
  measurements@SERVER or None)`; measurements are released as
  `metrics['reward']`.

  Args:
    initial_model_weights_fn: A TF computation of the initial weights.
    model_weights_distributor: A `DistributionProcess`.
    client_work: A `build_client_work` process.
    model_update_aggregator: An `AggregationProcess` of the clients'
      `ClientResult.update` weighted by `update_weight` (any
      `tff.aggregators` factory's, or an algorithm's own).
    model_finalizer: A `FinalizerProcess` of the aggregate (e.g.
      `build_apply_optimizer_finalizer`: a server optimizer).
    reward_fn: See above; default: the client work's outputs.

  Returns:
    A `ProcessWithClientOutputs`.
  """
  client_data_type = client_work.next.type_signature.parameter[2]

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        tff.federated_eval(initial_model_weights_fn, tff.SERVER),
        model_weights_distributor.initialize(), client_work.initialize(),
        model_update_aggregator.initialize(), model_finalizer.initialize()))

  @tff.federated_computation(init_fn.type_signature.result, client_data_type)
  def next_with_client_outputs(state, client_data):
    distributed = model_weights_distributor.next(
        state.distributor, state.global_model_weights)
    work = client_work.next(state.client_work, distributed.result,
                            client_data)
    client_result = getattr(work.result, CLIENT_RESULT)
    aggregated = model_update_aggregator.next(
        state.aggregator, client_result.update, client_result.update_weight)
    finalized = model_finalizer.next(
        state.finalizer, state.global_model_weights, aggregated.result)
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        finalized.result, distributed.state, work.state, aggregated.state,
        finalized.state))
    metrics = collections.OrderedDict(
        distributor=distributed.measurements,
        client_work=work.measurements, aggregator=aggregated.measurements,
        finalizer=finalized.measurements)
    if reward_fn is None:
      clients = getattr(work.result, OUTPUTS)
    else:
      clients, reward_measurements = reward_fn(state, client_data, work,
                                               aggregated, finalized)
      if reward_measurements is not None:
        metrics['reward'] = reward_measurements
    return RoundOutput(new_state, tff.federated_zip(metrics), clients)

  state_member = init_fn.type_signature.result.member

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

  return ProcessWithClientOutputs(init_fn, next_with_client_outputs,
                                  get_model_weights, set_model_weights)


def check_num_clients(num_clients) -> None:
  """Raises `ValueError` unless `num_clients` is an int >= 1."""
  if isinstance(num_clients, bool) or not isinstance(
      num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f'num_clients must be an int >= 1, got {num_clients!r}.')


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
  """Each client's own model, or its own part of one, in memory.

  The holder of per-client models for a loop of your own
  (`tff_fair.training` keeps the same entries on disk, versioned with the
  checkpoints: `training.client_models.ClientModelStore`). An entry per
  client, the part of the model it holds (`parts.WHOLE`, or FedRep's head),
  and `model`: the whole model a client uses (its entry joined to the
  global model).

  `round` runs a process whose clients hold their own entry (CGSV, IAFL: a
  whole model): each sampled client's input carries its entry (the global
  model's part the first time it is sampled), `next_with_client_outputs`
  returns each client's new one (`model`), and it is kept. Clients are
  identified by their index in `[0, num_clients)`, which the process reads
  from the attack spec. `ditto.PersonalModels` is the same holder with
  Ditto's round.

      models = client_outputs.ClientModels(process)
      state = process.initialize()
      for round_num in range(rounds):
        indices = sample(range(num_clients))
        output = models.round(state, indices, [datasets[i] for i in indices],
                              round_seed=round_num)
        state = output.state
  """

  def __init__(self, process: tff.learning.templates.LearningProcess,
               initial: Optional[Mapping[Hashable, Any]] = None,
               part: parts.ModelPart = parts.WHOLE):
    """Initializes the holder.

    Args:
      process: The process whose global model the entries join.
      initial: Entries to start from, by client id.
      part: What each client keeps of the model.
    """
    self._process = process
    self._entries = dict(initial or {})
    self.part = part

  def __getitem__(self, client_id: Hashable) -> Any:
    return self._entries[client_id]

  def __contains__(self, client_id: Hashable) -> bool:
    return client_id in self._entries

  def __len__(self) -> int:
    return len(self._entries)

  def items(self):
    return self._entries.items()

  def keep(self, client_id: Hashable, entry: Any) -> None:
    """Stores the client's new entry."""
    self._entries[client_id] = entry

  def get(self, client_id: Hashable, state: Any) -> Any:
    """The client's entry, or the global model's part of `state`."""
    if client_id in self._entries:
      return self._entries[client_id]
    return self.part.extract(self._process.get_model_weights(state))

  def model(self, client_id: Hashable,
            state: Any) -> tff.learning.models.ModelWeights:
    """The whole model the client uses: its entry on the global model."""
    return self.part.compose(self._process.get_model_weights(state),
                             self.get(client_id, state))

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
      self.keep(i, as_model_weights(values['model']))
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
