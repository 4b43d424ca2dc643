"""FedMD (Li & Wang 2019): heterogeneous models learn from shared logits.

Every client keeps a model of its own, of its own architecture; no model
ever leaves a client and there is no global model. A round of the sampled
clients:

1. Communicate: each client computes its model's logits on the round's
   alignment set, a seeded subset of the public set the server holds
   (broadcast to the clients).
2. Aggregate: the server averages them into the consensus
   (`tff.federated_mean`).
3. Distribute and digest: each client trains its model to match the
   consensus on the alignment set (mean absolute error between logits,
   Adam at 1e-3, one epoch by default: `distillation.mean_absolute_error`
   and `distillation.build_fitting_loop`).
4. Revisit: each client then trains on its private data (the client
   optimizer, as FedAvg's local training: its data set's epochs).

What travels: the alignment set (server to clients), logits of N x classes
floats per client (clients to server, averaged) and the consensus (server
to clients). The models stay where they are; between rounds a driver keeps
them for their clients (`next_with_client_outputs` hands each one back).

A TFF placement holds values of one type, and models of different
architectures have different types, so each architecture's sampled clients
are one call of that architecture's two federated computations:

    consensus:           (<{W}@CLIENTS, X@SERVER> -> float32[N, K]@SERVER)
    digest_and_revisit:  (<{C}@CLIENTS, X@SERVER, float32[N, K]@SERVER> ->
                          <clients={O}@CLIENTS,
                           metrics=<train=T, digest_loss=float32>@SERVER>)
    C = <data=D*, model=W>, O = <model=W, digest_loss=float32>

(`build_consensus`, `build_digest_and_revisit`). The architectures' means
are combined at the server weighted by their numbers of clients: the mean
over every sampled client, as one `federated_mean` would give it.

`build_fedmd` returns a `FedMDProcess`, the composite of both over the
architectures, with a `LearningProcess`'s methods (it is not one: its round
takes each architecture's clients apart and returns their models). Its
state S is `OrderedDict(round, models)`: the rounds run (which seed each
round's alignment subset) and each architecture's start model, the model a
client has before its first round:

    initialize:               ( -> S)
    next_with_client_outputs: (<S, {architecture: [C]}> ->
                               <state=S, metrics=M,
                                clients={architecture: [O]}>)
    get_model_weights:        (S -> {architecture: ModelWeights})
    set_model_weights:        (<S, {architecture: ModelWeights}> -> S)
    pretrain:                 ({architecture: ModelWeights} ->
                               {architecture: ModelWeights})

`pretrain` is the paper's transfer learning, optional (`pretrain_epochs`):
each architecture's model trained on the labeled public set; `initialize`
applies it to the initial models.

M holds, per architecture, `clients` (sampled this round) and
`digest_loss` (their mean MAE to the consensus over the digest's batches,
each before its step; NaN without clients), `consensus` (`size`: the
clients averaged, `examples`: the alignment set's) and `client_work/train`:
the revisit's training metrics over every architecture.
"""

import collections
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import distillation
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import per_client_training
from tff_fair.algorithms import training_loop

ModelWeights = tff.learning.models.ModelWeights
# Separates the alignment subsets' draws from other uses of the seed.
_ALIGNMENT_STREAM = 0xFED3D


def client_input(dataset: tf.data.Dataset,
                 model: ModelWeights) -> collections.OrderedDict:
  """One client's input C: its batched private data and its own model."""
  return collections.OrderedDict(data=dataset, model=model)


def _num_classes(model_fn: distillation.ModelFn) -> int:
  """The width of the model's logits (probed on one zero example)."""
  with tf.Graph().as_default():
    model = model_fn()
    spec = model.input_spec
    x_spec = spec['x'] if isinstance(spec, Mapping) else spec[0]
    probe = tf.zeros([1, *x_spec.shape[1:]], x_spec.dtype)
    return int(model.predict_on_batch(probe, training=False).shape[-1])


def _public_type(model_fn: distillation.ModelFn,
                 examples: int) -> tff.TensorType:
  """X: `examples` inputs of the model, as one tensor."""
  with tf.Graph().as_default():
    spec = model_fn().input_spec
  x_spec = spec['x'] if isinstance(spec, Mapping) else spec[0]
  return tff.TensorType(x_spec.dtype.as_numpy_dtype,
                        [examples, *x_spec.shape[1:]])


def build_client_logits(model_fn: distillation.ModelFn,
                        examples: int) -> tff.Computation:
  """The client's step 1, a TF computation `(<W, X> -> float32[N, K])`.

  Args:
    model_fn: The architecture's model builder.
    examples: N, the alignment set's size.
  """
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  classes = _num_classes(model_fn)

  @tff.tensorflow.computation(weights_type, _public_type(model_fn, examples))
  def client_logits(weights, x):
    model = model_fn()
    variables = ModelWeights.from_model(model)

    @tf.function
    def logits():
      tf.nest.map_structure(lambda v, t: v.assign(t), variables, weights)
      return distillation.predict_logits(model, x)

    return tf.ensure_shape(logits(), [examples, classes])

  return client_logits


def build_consensus(model_fn: distillation.ModelFn,
                    examples: int) -> tff.Computation:
  """Steps 1-2 for one architecture's clients.

  Returns:
    `(<{W}@CLIENTS, X@SERVER> -> float32[N, K]@SERVER)`: the alignment set
    broadcast, each client's logits on it, their mean at the server.
  """
  client_logits = build_client_logits(model_fn, examples)
  weights_type, x_type = client_logits.type_signature.parameter

  @tff.federated_computation(tff.FederatedType(weights_type, tff.CLIENTS),
                             tff.FederatedType(x_type, tff.SERVER))
  def consensus(models, x):
    return tff.federated_mean(tff.federated_map(
        client_logits, (models, tff.federated_broadcast(x))))

  return consensus


def build_client_update(
    model_fn: distillation.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    digest_optimizer: tff.learning.optimizers.Optimizer,
    *,
    examples: int,
    digest_epochs: int,
    digest_batch_size: int,
) -> tff.Computation:
  """The client's steps 3-4, a TF computation.

  `(<C, X, float32[N, K]> -> <O, T>)`: the client's model fitted to the
  consensus on X (`digest_epochs` passes in X's order, batches of
  `digest_batch_size`, the MAE, a fresh `digest_optimizer` state), then
  trained on its data (`client_optimizer_fn`, a fresh state); O =
  `<model, digest_loss>`, T the revisit's unfinalized training metrics.
  """
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  input_type = collections.OrderedDict(
      data=training_loop.data_type_of(model_fn), model=weights_type)
  logits_type = tff.TensorType(np.float32,
                               [examples, _num_classes(model_fn)])

  @tff.tensorflow.computation(input_type, _public_type(model_fn, examples),
                              logits_type)
  def client_update(client_data, x, consensus):
    model = model_fn()
    fit = distillation.build_fitting_loop(
        model, digest_optimizer, distillation.mean_absolute_error)
    revisit = training_loop.build_training_loop(model, client_optimizer_fn)
    public = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=x, logits=consensus)).batch(digest_batch_size).repeat(digest_epochs)
    digested = fit(client_data['model'], public)
    # The revisit starts from the digested weights (a data dependency, so
    # it runs after the digest).
    trained = revisit(digested['weights'], client_data['data'])
    return (collections.OrderedDict(model=trained['weights'],
                                    digest_loss=digested['loss']),
            trained['metrics'])

  return client_update


def build_digest_and_revisit(
    model_fn: distillation.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    digest_optimizer: tff.learning.optimizers.Optimizer,
    *,
    examples: int,
    digest_epochs: int = 1,
    digest_batch_size: int = 64,
    metrics_aggregator: fed_avg.MetricsAggregator = None,
) -> tff.Computation:
  """Steps 3-4 for one architecture's clients (`build_client_update`).

  Returns:
    `(<{C}@CLIENTS, X@SERVER, float32[N, K]@SERVER> -> <clients={O}@CLIENTS,
    metrics=<train=T, digest_loss=float32>@SERVER>)`: X and the consensus
    broadcast, each client's digest and revisit, their training metrics
    aggregated (`metrics_aggregator`, default sum then finalize) and their
    mean digest loss.
  """
  client_update = build_client_update(
      model_fn, client_optimizer_fn, digest_optimizer, examples=examples,
      digest_epochs=digest_epochs, digest_batch_size=digest_batch_size)
  input_type, x_type, logits_type = client_update.type_signature.parameter
  aggregate_metrics = fed_avg.metrics_aggregation(model_fn,
                                                  metrics_aggregator)

  @tff.federated_computation(tff.FederatedType(input_type, tff.CLIENTS),
                             tff.FederatedType(x_type, tff.SERVER),
                             tff.FederatedType(logits_type, tff.SERVER))
  def digest_and_revisit(client_data, x, consensus):
    outputs, metrics = tff.federated_map(client_update, (
        client_data, tff.federated_broadcast(x),
        tff.federated_broadcast(consensus)))
    return collections.OrderedDict(
        clients=outputs,
        metrics=tff.federated_zip(collections.OrderedDict(
            train=aggregate_metrics(metrics),
            digest_loss=tff.federated_mean(outputs.digest_loss))))

  return digest_and_revisit


class FedMDProcess:
  """FedMD over one or more architectures (module docstring).

  Built by `build_fedmd`.

  Attributes:
    consensus: Architecture -> its `build_consensus` computation.
    digest_and_revisit: Architecture -> its `build_digest_and_revisit`.
    alignment_examples: N, the alignment set's size each round.
  """

  def __init__(self, consensus: Mapping[str, tff.Computation],
               digest_and_revisit: Mapping[str, tff.Computation],
               initial_weights: Mapping[str, tff.Computation],
               public_x: np.ndarray, alignment_examples: int, seed: int,
               pretraining: Optional[Mapping[str, tff.Computation]] = None,
               public_data: Optional[tf.data.Dataset] = None):
    self.consensus = collections.OrderedDict(consensus)
    self.digest_and_revisit = collections.OrderedDict(digest_and_revisit)
    self._initial_weights = collections.OrderedDict(initial_weights)
    self._public_x = public_x
    self.alignment_examples = alignment_examples
    self._seed = seed
    self._pretraining = pretraining
    self._public_data = public_data

  @property
  def architectures(self) -> tuple[str, ...]:
    return tuple(self.consensus)

  def initialize(self) -> collections.OrderedDict:
    """Round 0 and each architecture's initial model (`pretrain`ed)."""
    return collections.OrderedDict(
        round=np.int64(0), models=self.pretrain(collections.OrderedDict(
            (name, fn()) for name, fn in self._initial_weights.items())))

  def pretrain(self, weights: Mapping[str, ModelWeights]
               ) -> collections.OrderedDict:
    """The paper's transfer learning on the labeled public set.

    Each architecture's model trained on the public examples and their
    labels (`pretrain_epochs` of `build_fedmd`); the weights as given
    without pretraining.
    """
    self._check_names(weights)
    return collections.OrderedDict(
        (name, client_outputs.as_model_weights(
            w if self._pretraining is None
            else self._pretraining[name](w, self._public_data)))
        for name, w in weights.items())

  def get_model_weights(self, state: Mapping[str, Any]
                        ) -> collections.OrderedDict:
    """Architecture -> its start model (what a client starts from)."""
    return collections.OrderedDict(
        (name, client_outputs.as_model_weights(state['models'][name]))
        for name in self.architectures)

  def set_model_weights(self, state: Mapping[str, Any],
                        weights: Mapping[str, ModelWeights]
                        ) -> collections.OrderedDict:
    """`state` with the start models of the architectures in `weights`."""
    self._check_names(weights)
    models = self.get_model_weights(state)
    models.update((name, client_outputs.as_model_weights(w))
                  for name, w in weights.items())
    return collections.OrderedDict(round=state['round'], models=models)

  def _check_names(self, mapping: Mapping[str, Any]) -> None:
    unknown = sorted(set(mapping) - set(self.architectures))
    if unknown:
      raise ValueError(f'Unknown architecture(s) {unknown}; this process'
                       f' has {list(self.architectures)}.')

  def alignment_rows(self, round_num: int) -> np.ndarray:
    """The public examples round `round_num` aligns on, in digest order.

    A permutation seeded by (seed, round), its first `alignment_examples`:
    a fresh subset in a fresh order each round (the whole public set,
    reshuffled, when it is all of it).
    """
    rng = np.random.default_rng([self._seed, _ALIGNMENT_STREAM, round_num])
    return rng.permutation(len(self._public_x))[:self.alignment_examples]

  def next_with_client_outputs(
      self, state: Mapping[str, Any],
      client_data: Mapping[str, Sequence[Any]],
  ) -> client_outputs.RoundOutput:
    """One round (module docstring).

    Args:
      state: The state the round starts from.
      client_data: Architecture -> its sampled clients' inputs
        (`client_input`: data and own model; an architecture may be left
        out).

    Returns:
      `RoundOutput(state, metrics, clients)`: clients maps each
      architecture that had clients to their outputs O, in input order.
    """
    self._check_names(client_data)
    round_num = int(state['round']) + 1
    groups = collections.OrderedDict(
        (name, list(client_data[name])) for name in self.architectures
        if client_data.get(name))
    metrics = collections.OrderedDict(
        (name, collections.OrderedDict(clients=len(groups.get(name, ())),
                                       digest_loss=float('nan')))
        for name in self.architectures)
    clients, train = collections.OrderedDict(), []
    total = sum(len(inputs) for inputs in groups.values())
    x = self._public_x[self.alignment_rows(round_num)]
    if groups:
      consensus = sum(
          len(inputs) / total * np.asarray(self.consensus[name](
              [client['model'] for client in inputs], x), np.float64)
          for name, inputs in groups.items()).astype(np.float32)
      for name, inputs in groups.items():
        output = self.digest_and_revisit[name](inputs, x, consensus)
        clients[name] = [collections.OrderedDict(
            model=client_outputs.as_model_weights(o['model']),
            digest_loss=float(o['digest_loss'])) for o in output['clients']]
        metrics[name]['digest_loss'] = float(
            output['metrics']['digest_loss'])
        train.append(output['metrics']['train'])
    metrics['consensus'] = collections.OrderedDict(size=total,
                                                   examples=len(x))
    metrics['client_work'] = collections.OrderedDict(
        train=distillation.combine_train_metrics(train))
    new_state = collections.OrderedDict(round=np.int64(round_num),
                                        models=state['models'])
    return client_outputs.RoundOutput(new_state, metrics, clients)


def build_fedmd(
    model_fns: Mapping[str, distillation.ModelFn],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    public_x: np.ndarray,
    alignment_examples: int = 0,
    digest_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    digest_epochs: int = 1,
    digest_batch_size: int = 64,
    metrics_aggregator: fed_avg.MetricsAggregator = None,
    seed: int = 0,
    public_y: Optional[np.ndarray] = None,
    pretrain_epochs: int = 0,
    pretrain_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    pretrain_batch_size: int = 32,
) -> FedMDProcess:
  """Builds FedMD over one or more architectures (module docstring).

  Args:
    model_fns: Architecture name -> a no-arg callable returning a fresh
      `VariableModel` of it; every architecture reads the same data and
      predicts the same classes.
    client_optimizer_fn: The revisit's optimizer (private training).
    public_x: The server's public examples (their labels are not used).
    alignment_examples: Public examples each round aligns on, a fresh
      seeded subset each round (the paper's 5000 of its public set); 0:
      all of them.
    digest_optimizer: Default `tff.learning.optimizers.build_adam(1e-3)`,
      the paper's.
    digest_epochs: Passes over the alignment set in the digest (the
      paper's 1).
    digest_batch_size: Alignment examples per digest step.
    metrics_aggregator: Of the revisit's metrics, as in
      `fed_avg.build_fed_avg`.
    seed: Seeds the alignment subsets (with the round) and the
      pretraining's shuffle.
    public_y: The public set's labels, read only by the pretraining.
    pretrain_epochs: The paper's transfer learning: `initialize` (and
      `pretrain`) trains each architecture's start model for this many
      epochs on the labeled public set; 0 (default): none, the public labels
      are not read.
    pretrain_optimizer: Its optimizer (default `client_optimizer_fn`).
    pretrain_batch_size: Its batch size.

  Returns:
    A `FedMDProcess`.

  Raises:
    ValueError: For no architecture, an empty public set, or a count out of
      range.
  """
  if not model_fns:
    raise ValueError('model_fns must name at least one architecture.')
  if not len(public_x):
    raise ValueError('FedMD needs a non-empty public set to align on.')
  distillation.check_int('alignment_examples', alignment_examples, 0)
  if alignment_examples > len(public_x):
    raise ValueError(f'alignment_examples={alignment_examples} is more than'
                     f' the {len(public_x)} public examples.')
  distillation.check_int('digest_epochs', digest_epochs, 1)
  distillation.check_int('digest_batch_size', digest_batch_size, 1)
  distillation.check_int('pretrain_epochs', pretrain_epochs, 0)
  distillation.check_int('pretrain_batch_size', pretrain_batch_size, 1)
  pretraining = public_data = None
  if pretrain_epochs:
    if public_y is None or len(public_y) != len(public_x):
      raise ValueError('Pretraining reads the public labels: give public_y,'
                       ' one label per public example.')
    pretraining = {name: per_client_training.build_client_train_fn(
        fn, pretrain_optimizer or client_optimizer_fn, pretrain_epochs)
                   for name, fn in model_fns.items()}
    public_data = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=np.asarray(public_x), y=np.asarray(public_y))).shuffle(
            len(public_x), seed=seed).batch(pretrain_batch_size)
  examples = alignment_examples or len(public_x)
  optimizer = (digest_optimizer
               or tff.learning.optimizers.build_adam(learning_rate=1e-3))
  return FedMDProcess(
      consensus={name: build_consensus(fn, examples)
                 for name, fn in model_fns.items()},
      digest_and_revisit={
          name: build_digest_and_revisit(
              fn, client_optimizer_fn, optimizer, examples=examples,
              digest_epochs=digest_epochs,
              digest_batch_size=digest_batch_size,
              metrics_aggregator=metrics_aggregator)
          for name, fn in model_fns.items()},
      initial_weights={name: client_outputs.initial_weights_fn(fn)
                       for name, fn in model_fns.items()},
      public_x=np.asarray(public_x), alignment_examples=examples,
      seed=seed, pretraining=pretraining, public_data=public_data)
