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


def initial_weights_computation(model_fn) -> tff.Computation:
  """`( -> ModelWeights)`: a fresh model's weights, as TFF's processes."""

  @tff.tensorflow.computation
  def initial_weights():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return initial_weights


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
      self._models[i] = _as_model_weights(values['model'])
    return output


def _as_model_weights(weights) -> tff.learning.models.ModelWeights:
  """Numpy `ModelWeights` from what the runtime returns."""
  if isinstance(weights, Mapping):
    trainable, non_trainable = weights['trainable'], weights['non_trainable']
  else:
    trainable, non_trainable = weights.trainable, weights.non_trainable
  return tff.learning.models.ModelWeights(
      trainable=[np.asarray(t) for t in trainable],
      non_trainable=[np.asarray(t) for t in non_trainable])
