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
placed at the clients. Whoever drives the rounds (`tff_fair.training`, or
your own loop) keeps the personal models between rounds; one round is:

    personal = process.personalize(state, personal_inputs)  # anchored at w^t
    state, metrics = process.next(state, client_inputs)     # w^t -> w^{t+1}

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

The personal model a round returns is, by default, the average of its
iterates (`average_personal_iterates`): on one client's skewed data, SGD at
the usual learning rate now and then ends an epoch on a collapsed iterate
(one class predicted for most examples) that the average does not follow.

Type signatures:

    initialize:  ( -> S@SERVER)
    next:        (<S@SERVER, {<data=D*, attack=A*>}@CLIENTS> ->
                  <state=S@SERVER, metrics=M@SERVER>)
    personalize: (<S@SERVER, {<data=D*, personal=W, lam=float32>}@CLIENTS>
                  -> {<personal=W, loss=float32, num_examples=int64>}@CLIENTS)
"""

import collections
from collections.abc import Callable
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import client_training
from tff_fair.algorithms import fed_avg

ModelFn = Callable[[], tff.learning.models.VariableModel]
ModelWeights = tff.learning.models.ModelWeights


class DittoProcess(tff.learning.templates.LearningProcess):
  """A `LearningProcess` for the global model plus `personalize`.

  Attributes:
    personalize: The personal-model update; see the module docstring.
  """

  def __init__(self, global_process: tff.learning.templates.LearningProcess,
               personalize: tff.Computation):
    super().__init__(
        global_process.initialize,
        global_process.next,
        global_process.get_model_weights,
        global_process.set_model_weights,
        get_hparams_fn=global_process.get_hparams,
        set_hparams_fn=global_process.set_hparams,
    )
    self._personalize = personalize

  @property
  def personalize(self) -> tff.Computation:
    return self._personalize


def personal_input(
    dataset: tf.data.Dataset, personal: ModelWeights, lam: float
) -> collections.OrderedDict:
  """One client's input to `personalize`."""
  return collections.OrderedDict(data=dataset, personal=personal,
                                 lam=float(lam))


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
  one; see `client_training` for the collapse this prevents.
  """
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  input_type = tff.types.to_type(collections.OrderedDict(
      data=client_training.data_type_of(model_fn), personal=weights_type,
      lam=np.float32))

  @tff.tensorflow.computation(weights_type, input_type)
  def personal_update(anchor, client):
    loop = client_training.build_training_loop(
        model_fn(), optimizer, average_iterates=average_iterates)
    trained = loop(client['personal'], client['data'], anchor=anchor,
                   lam=client['lam'])
    return collections.OrderedDict(
        personal=trained['weights'], loss=trained['loss'],
        num_examples=trained['num_examples'])

  return personal_update


def build_ditto(
    model_fn: ModelFn,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    personal_optimizer: tff.learning.optimizers.Optimizer,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    average_personal_iterates: bool = True,
) -> DittoProcess:
  """Builds Ditto.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer: Local optimizer of the global model's FedAvg.
    server_optimizer: Server optimizer of FedAvg.
    personal_optimizer: Optimizer of the personal models (SGD as in the
      paper, Adam or AdamW).
    model_aggregator: Any `tff.aggregators` factory for the global model's
      updates (robust, differentially private, compressed, ...).
    average_personal_iterates: The new personal model is the mean of the
      round's iterates (default; stable on skewed clients) rather than the
      last iterate (the reference code).

  Returns:
    A `DittoProcess`; see the module docstring.
  """
  global_process = fed_avg.build_fed_avg(
      model_fn, client_optimizer, server_optimizer, model_aggregator)
  personal_update = build_personal_update(
      model_fn, personal_optimizer,
      average_iterates=average_personal_iterates)
  state_type = global_process.initialize.type_signature.result
  client_type = personal_update.type_signature.parameter[1]

  @tff.federated_computation(state_type,
                             tff.FederatedType(client_type, tff.CLIENTS))
  def personalize(state, clients):
    anchor = tff.federated_broadcast(
        tff.federated_map(global_process.get_model_weights, state))
    return tff.federated_map(personal_update, (anchor, clients))

  return DittoProcess(global_process, personalize)
