"""Ditto: fair and robust personalization by a proximal term (Li et al. 2021).

Each client k keeps a personal model v_k that minimizes

    F_k(v) + (lambda_k / 2) ||v - w^t||^2,

anchored at the global model w^t it received; the global model is trained by
FedAvg (`tff_fair.algorithms.fed_avg`, so any `tff.learning` optimizer and
any `tff.aggregators` factory, and clients may attack).

Why two computations. A `tff.learning.templates.LearningProcess` can only
return server-placed values, and personal models must never reach the server.
So `build_ditto` returns a `DittoProcess`: a genuine `LearningProcess` for
the global model (drive it with `initialize`/`next`/`get_model_weights`/
`set_model_weights` or `tff.simulation.run_training_process` like any other),
plus the computation `personalize` that returns the updated personal models
placed at the clients. Whoever drives the rounds keeps the personal models
between rounds: `tff_fair.training` on disk, `PersonalModels` in memory for
a loop of your own. One round is:

    personal = process.personalize(state, personal_inputs)  # anchored at w^t
    state, metrics = process.next(state, datasets)          # w^t -> w^{t+1}

`personalize` reads w^t from the state it is given, so it must be called
with the state *before* `next` (both see the same w^t).

Variants. Within a round the personal update reads only v_k, w^t and the
batches, never the client's evolving copy of the global model, so the
reference code's interleaved loop (one personal step and one global step
per minibatch) equals running the personal steps over the same batches
separately. `interleaved`: `personalize` gets the very batches `next` gets.
`sequential` (the usual default): the personal model trains for its own
number of epochs (`personal_epochs`) on its own shuffle of the client's data.
The driver decides which data it passes; this module only computes.

`personalize_and_next` is the interleaved round in one computation and one
pass over each client's batches: per batch one global step and one personal
step (anchored at w^t), as the reference's loop. It returns what
`personalize` and then `next` would (the tests check equality), while
reading and shipping each client's data once. It is FedAvg's four parts
composed with the paired client work (`client_outputs.compose`), so it
returns CLIENTS-placed values beside the state and needs a context that
returns them (TFF's local runtime; one remote worker).

The personal model a round returns is, by default, the average of its
iterates (`average_personal_iterates`): on one client's skewed data, SGD at
the usual learning rate now and then ends an epoch on a collapsed iterate
(one class predicted for most examples) that the average does not follow.

Type signatures (`next` as `tff.learning.algorithms.build_weighted_fed_avg`'s):

    initialize:  ( -> S@SERVER)
    next:        (<S@SERVER, {D*}@CLIENTS> ->
                  <state=S@SERVER, metrics=M@SERVER>)
    personalize: (<S@SERVER, {<data=D*, personal=W, lam=float32>}@CLIENTS>
                  -> {<personal=W, loss=float32, num_examples=int64>}@CLIENTS)
    personalize_and_next:
                 (<S@SERVER, {<data=D*, personal=W, lam=float32>}@CLIENTS>
                  -> <state=S@SERVER, metrics=M@SERVER,
                      clients={<personal=W, loss=float32,
                                num_examples=int64>}@CLIENTS>)

With `client_context=True` (`tff_fair.training` uses it) `next` takes
`{<data=D*, attack=A*>}@CLIENTS` (`fed_avg.client_input`), so chosen clients
can attack the global model; the state is the same either way.
"""

import collections
import math
import numbers
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import training_loop

ModelFn = Callable[[], tff.learning.models.VariableModel]


class DittoProcess(tff.learning.templates.LearningProcess):
  """A `LearningProcess` for the global model plus `personalize`.

  Attributes:
    personalize: The personal-model update; see the module docstring.
    personalize_and_next: The interleaved round in one pass over each
      client's data; see the module docstring.
  """

  def __init__(self, global_process: tff.learning.templates.LearningProcess,
               personalize: tff.Computation,
               personalize_and_next: tff.Computation):
    super().__init__(
        global_process.initialize,
        global_process.next,
        global_process.get_model_weights,
        global_process.set_model_weights,
        get_hparams_fn=global_process.get_hparams,
        set_hparams_fn=global_process.set_hparams,
    )
    self._personalize = personalize
    self._personalize_and_next = personalize_and_next

  @property
  def personalize(self) -> tff.Computation:
    return self._personalize

  @property
  def personalize_and_next(self) -> tff.Computation:
    return self._personalize_and_next


def check_lambda(lam: float) -> None:
  """Refuses a lambda that is not a finite number >= 0 (ValueError)."""
  if (isinstance(lam, bool) or not isinstance(lam, numbers.Real)
      or not math.isfinite(lam) or lam < 0):
    raise ValueError(
        f"Ditto's lambda must be a finite number >= 0, got {lam!r} (0 is"
        ' purely local training; larger values pull the personal model'
        ' towards the global one).')


def personal_input(
    dataset: tf.data.Dataset, personal: tff.learning.models.ModelWeights,
    lam: float
) -> collections.OrderedDict:
  """One client's input to `personalize`; `lam` must be finite and >= 0."""
  check_lambda(lam)
  return collections.OrderedDict(data=dataset, personal=personal,
                                 lam=float(lam))


def paired_input(
    dataset: tf.data.Dataset, personal: tff.learning.models.ModelWeights,
    lam: float, *, client_context: bool = False,
    attack: Optional[collections.OrderedDict] = None,
) -> collections.OrderedDict:
  """One client's input to `personalize_and_next`.

  Args:
    dataset: The client's batched data set (both models train on it).
    personal: The personal model it starts from.
    lam: Ditto's lambda, finite and >= 0.
    client_context: Whether the process was built with `client_context`.
    attack: Under `client_context`, the client's
      `update_attacks.attack_spec` (default no attack).
  """
  if attack is not None and not client_context:
    raise ValueError('An attack spec needs a process built with'
                     ' client_context=True (and client_context=True here).')
  fields = personal_input(dataset, personal, lam)
  if not client_context:
    return fields
  return collections.OrderedDict(
      **fed_avg.client_input(dataset, attack),
      personal=fields['personal'], lam=fields['lam'])


def build_personal_update(
    model_fn: ModelFn, optimizer: tff.learning.optimizers.Optimizer,
    average_iterates: bool = True,
) -> tff.Computation:
  """The per-client TF computation of the personal step.

  `(<anchor=W, <data=D*, personal=W, lam=float32>> -> <personal=W,
  loss=float32, num_examples=int64>)`: minibatch steps of `optimizer` on
  F_k(v) + (lam/2)||v - anchor||^2, i.e. gradient + lam * (v - anchor), as
  TFF writes FedProx's proximal term. Non-trainable weights (if any) follow
  the model's own updates. `loss` is the mean training loss over batches,
  each measured before its step: it does not show where the steps end.

  With `average_iterates` (the default) the new personal model is the mean
  of the iterates after each of the round's steps rather than the last
  one; see `training_loop` for the collapse this prevents.
  """
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  input_type = tff.types.to_type(collections.OrderedDict(
      data=training_loop.data_type_of(model_fn), personal=weights_type,
      lam=np.float32))

  @tff.tensorflow.computation(weights_type, input_type)
  def personal_update(anchor, client):
    loop = training_loop.build_training_loop(
        model_fn(), optimizer, average_iterates=average_iterates)
    trained = loop(client['personal'], client['data'], anchor=anchor,
                   lam=client['lam'])
    return collections.OrderedDict(
        personal=trained['weights'], loss=trained['loss'],
        num_examples=trained['num_examples'])

  return personal_update


def build_paired_client_update(
    model_fn: ModelFn,
    optimizer: tff.learning.optimizers.Optimizer,
    personal_optimizer: tff.learning.optimizers.Optimizer,
    *,
    average_personal_iterates: bool = True,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    client_context: bool = False,
) -> tff.Computation:
  """One client's interleaved Ditto round, in one pass over its batches.

  `(<W, <data=D*, personal=W, lam=float32>> -> <ClientResult, M,
  <personal=W, loss=float32, num_examples=int64>>)`, with `attack=A*` in the
  client's input under `client_context`: per batch one FedAvg step of the
  global model from the broadcast weights w^t, which also anchor one
  personal step (`build_personal_update`'s). The global update and weight
  are `fed_avg.build_client_work`'s, the personal result is `personalize`'s.
  """
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  fields = collections.OrderedDict(personal=weights_type, lam=np.float32)
  data_type = training_loop.data_type_of(model_fn)
  input_type = tff.types.to_type(
      fed_avg.context_type(data_type, **fields) if client_context else
      collections.OrderedDict(data=data_type, **fields))

  @tff.tensorflow.computation(weights_type, input_type)
  def paired_update(initial_weights, client):
    data, spec, _ = fed_avg.read_client_input(
        client if client_context else client['data'], client_context,
        initial_weights, derive_seed=False)
    loop = training_loop.build_paired_training_loop(
        model_fn(), optimizer, model_fn(), personal_optimizer,
        proximal_average_iterates=average_personal_iterates)
    trained, personal = loop(initial_weights, client['personal'], data,
                             initial_weights, client['lam'])
    update, weight = fed_avg.update_and_weight(initial_weights, trained, spec,
                                               client_weighting)
    return (tff.learning.templates.ClientResult(update=update,
                                                update_weight=weight),
            trained['metrics'],
            collections.OrderedDict(personal=personal['weights'],
                                    loss=personal['loss'],
                                    num_examples=personal['num_examples']))

  return paired_update


def build_ditto(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    personal_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess] = None,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    average_personal_iterates: bool = True,
    client_context: bool = False,
) -> DittoProcess:
  """Builds Ditto.

  The global model is trained by `fed_avg.build_fed_avg` with the same
  arguments (TFF's, as in `tff.learning.algorithms.build_weighted_fed_avg`);
  `personalize` trains the personal models.

  Type signatures:

      initialize:  ( -> S@SERVER)
      next:        (<S@SERVER, {D*}@CLIENTS> ->
                    <state=S@SERVER, metrics=M@SERVER>)
      personalize: (<S@SERVER, {<data=D*, personal=W, lam=float32>}@CLIENTS>
                    -> {<personal=W, loss=float32, num_examples=int64>}
                    @CLIENTS)

  With `client_context=True`, `next` takes `{<data=D*, attack=A*>}@CLIENTS`
  (`fed_avg.client_input`); `personalize` is the same either way.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer_fn: Local optimizer of the global model's FedAvg.
    server_optimizer_fn: Server optimizer of FedAvg; default SGD with
      learning rate 1.0 (TFF's default).
    personal_optimizer_fn: Optimizer of the personal models (SGD as in the
      paper, Adam or AdamW); default `client_optimizer_fn`.
    client_weighting: As in `fed_avg.build_fed_avg`.
    model_distributor: As in `fed_avg.build_fed_avg`.
    model_aggregator: Any `tff.aggregators` factory for the global model's
      updates (robust, differentially private, compressed, ...).
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    average_personal_iterates: The new personal model is the mean of the
      round's iterates (default; stable on skewed clients) rather than the
      last iterate (the reference code).
    client_context: Per-client attack specs in `next`'s input; see
      `fed_avg.build_fed_avg`.

  Returns:
    A `DittoProcess`; see the module docstring.
  """
  parts = fed_avg.build_fed_avg_parts(
      model_fn, client_optimizer_fn, server_optimizer_fn,
      client_weighting=client_weighting,
      model_distributor=model_distributor,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator,
      client_context=client_context)
  global_process = tff.learning.templates.compose_learning_process(*parts)
  personal_optimizer_fn = personal_optimizer_fn or client_optimizer_fn
  personal_update = build_personal_update(
      model_fn, personal_optimizer_fn,
      average_iterates=average_personal_iterates)
  state_type = global_process.initialize.type_signature.result
  client_type = personal_update.type_signature.parameter[1]

  @tff.federated_computation(state_type,
                             tff.FederatedType(client_type, tff.CLIENTS))
  def personalize(state, clients):
    anchor = tff.federated_broadcast(
        tff.federated_map(global_process.get_model_weights, state))
    return tff.federated_map(personal_update, (anchor, clients))

  paired_update = build_paired_client_update(
      model_fn, client_optimizer_fn, personal_optimizer_fn,
      average_personal_iterates=average_personal_iterates,
      client_weighting=client_weighting, client_context=client_context)
  # FedAvg's four parts with the paired client update in place of the
  # client work's: the same state and metrics as `next`.
  paired = client_outputs.compose(
      parts.initial_model_weights_fn, parts.model_weights_distributor,
      client_outputs.build_client_work(
          paired_update,
          fed_avg.metrics_aggregation(model_fn, metrics_aggregator)),
      parts.model_update_aggregator, parts.model_finalizer)
  personalize_and_next = paired.next_with_client_outputs
  return DittoProcess(global_process, personalize, personalize_and_next)


def _check_lengths(client_ids: Sequence[Hashable],
                   datasets: Sequence[tf.data.Dataset]) -> None:
  if len(client_ids) != len(datasets):
    raise ValueError(f'{len(client_ids)} client ids for {len(datasets)}'
                     ' data sets.')


class PersonalModels(client_outputs.ClientModels):
  """Each client's personal model, in memory, for a loop of your own.

  `client_outputs.ClientModels` (the holder of per-client models) with
  Ditto's round: it trains the sampled clients' personal models with
  `personalize` (anchored at the global model in `state`), keeps them,
  then runs `next`. A client seen for the first time starts from the
  current global model. Nothing is written to disk (`tff_fair.training`
  keeps personal models in a versioned on-disk store instead).

      personal = ditto.PersonalModels(process, lam=0.1)
      state = process.initialize()
      for round_num in range(rounds):
        ids = sample(client_data.client_ids)
        datasets = [client_data.create_tf_dataset_for_client(c) for c in ids]
        state, metrics = personal.round(state, ids, datasets)
      personal[ids[0]].assign_weights_to(keras_model)

  `personalize` returns values placed at the clients, so this needs a
  context that returns them (TFF's local runtime does; TFF's
  `NativeFederatedContext` of `tff.program` does not).
  """

  def __init__(
      self,
      process: DittoProcess,
      lam: Union[float, Mapping[Hashable, float]] = 1.0,
      initial: Optional[
          Mapping[Hashable, tff.learning.models.ModelWeights]] = None,
  ):
    """Initializes the holder.

    Args:
      process: A `DittoProcess`.
      lam: Ditto's lambda, one for all clients or one per client id.
      initial: Personal models to start from, by client id.
    """
    super().__init__(process, initial)
    self._lam = lam

  def lam(self, client_id: Hashable) -> float:
    """The lambda of `client_id`."""
    if isinstance(self._lam, Mapping):
      return float(self._lam[client_id])
    return float(self._lam)

  def personalize(
      self, state: Any, client_ids: Sequence[Hashable],
      datasets: Sequence[tf.data.Dataset],
  ) -> dict[Hashable, collections.OrderedDict]:
    """Trains and keeps the personal models of `client_ids` on `datasets`.

    Args:
      state: The process state of the round (before `next`).
      client_ids: The round's clients.
      datasets: Their batched data sets, in the same order.

    Returns:
      `{client_id: OrderedDict(loss=, num_examples=)}`: the mean training
      loss over the round's batches and the examples seen.
    """
    _check_lengths(client_ids, datasets)
    if not client_ids:
      return {}
    inputs = [personal_input(dataset, self.get(cid, state), self.lam(cid))
              for cid, dataset in zip(client_ids, datasets)]
    return self._keep(client_ids, self._process.personalize(state, inputs))

  def _keep(self, client_ids, outputs):
    results = {}
    for cid, out in zip(client_ids, outputs):
      self.keep(cid, out['personal'])
      results[cid] = collections.OrderedDict(
          loss=float(out['loss']), num_examples=int(out['num_examples']))
    return results

  def round(
      self, state: Any, client_ids: Sequence[Hashable],
      datasets: Sequence[tf.data.Dataset],
      next_inputs: Optional[Sequence[Any]] = None,
  ) -> tff.learning.templates.LearningProcessOutput:
    """One Ditto round: `personalize` and `next`, both from `state`.

    In one computation and one pass over each client's batches
    (`personalize_and_next`); with `next_inputs`, `personalize` then `next`.

    Args:
      state: The process state before the round.
      client_ids: The round's clients.
      datasets: Their batched data sets, for both the personal and the
        global update (the same batches, as the reference's interleaved
        loop).
      next_inputs: The clients' inputs to `next` when they differ from
        `datasets` (e.g. `fed_avg.client_input`s for a process built with
        `client_context`).

    Returns:
      `next`'s `LearningProcessOutput(state, metrics)`.
    """
    if next_inputs is not None:
      self.personalize(state, client_ids, datasets)
      return self._process.next(state, list(next_inputs))
    _check_lengths(client_ids, datasets)
    # Both models in one pass over each client's batches.
    output = self._process.personalize_and_next(state, [
        paired_input(dataset, self.get(cid, state), self.lam(cid))
        for cid, dataset in zip(client_ids, datasets)])
    self._keep(client_ids, output.clients)
    return tff.learning.templates.LearningProcessOutput(output.state,
                                                        output.metrics)
