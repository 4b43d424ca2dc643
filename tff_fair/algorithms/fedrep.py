"""FedRep: a shared body, a head per client (Collins et al., ICML 2021).

The model splits into a body (every trainable variable but the last
`head_variables`) that all clients learn together and a head (the last
`head_variables`: the output layer, `ModelSpec.head_variables`) that each
client keeps of its own. A round, on each sampled client:

1. `head_epochs` passes over its data train its head, the body frozen
   (the personal optimizer);
2. `body_epochs` passes train the body, the new head frozen (the client
   optimizer);
3. it sends its body update (`initial - trained`, TFF's sign), weighted by
   the examples of its body passes as in FedAvg; its head stays with it.

The server aggregates the body updates (`model_aggregator`, over the body
only) and applies them to its body with the server optimizer; the server's
head is never updated by a round (it is the head a process starts from).
Only the body travels back to the server: each client's upload is the
body's trainable variables (`bytes_sent`, their uncompressed size).

Data. Each client's input holds ONE epoch of its batched data; the
process repeats it `head_epochs` and `body_epochs` times, each pass a new
shuffle if the data set reshuffles each iteration. (TFF's FedAvg makes one
pass over whatever a client is given; `body_epochs=1` is that.)

Plain data sets (TFF's default, `tff.learning.programs.train_model` or a
loop of your own):

    next: (<S@SERVER, {D*}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER>)

Nobody keeps a head between rounds then: the server broadcasts its whole
model and every client starts its round from the server's head; the heads
it trains are returned by `next_with_client_outputs` and dropped by `next`.

Per-client heads (`client_context=True`; `tff_fair.training` opts in):
each client's input is `client_outputs.model_client_input(dataset, head,
attack_spec)`, `<data=D*, attack=A*, model=H>`: its own head H (the
server's the first time, `parts.head(head_variables).extract` of the
server model) and an attack spec (a malicious client attacks its body
update; heads are never attacked). The server then broadcasts only the
body, and `next_with_client_outputs` returns each client's new head in
`model`, so `client_outputs.ClientModels(process,
part=parts.head(head_variables))` keeps the heads in a loop of your own.
A head returned at CLIENTS placement stands for the client keeping it: it
is never aggregated nor sent to the server.

Type signatures (`client_outputs`):

    initialize: ( -> S@SERVER)
    next: (<S@SERVER, {C}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER>)
    next_with_client_outputs: (<S@SERVER, {C}@CLIENTS> ->
        <state=S@SERVER, metrics=M@SERVER, clients={O}@CLIENTS>)
    C = D* (plain) or <data=D*, attack=A*, model=H> (context)
    H = ModelWeights(trainable=the head's variables, non_trainable=[])
    O = <model=H, head_loss=float32, body_loss=float32, bytes_sent=int64>
    M = <distributor=(), client_work=<train=T, bytes_sent=int64>,
         aggregator=the model aggregator's, finalizer=the server
         optimizer's>

`S.global_model_weights` is a whole model (the body and the server's head,
so `get_model_weights` and TFF's evaluation see a model of the
architecture); `head_loss`/`body_loss` are the mean training losses over
each phase's batches; T (the clients' training metrics) are those of the
body passes; `client_work.bytes_sent` sums the uploads of the round.

Evaluating. A client's model is its head on the server's body
(`parts.ModelPart.compose`). The server model's own head is the initial
one, never trained: the server model is not a model any client uses.
"""

import collections
from collections.abc import Callable
import numbers
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import training_loop
from tff_fair.models import parts

ModelWeights = tff.learning.models.ModelWeights


class _Split:
  """The body and the head of a model's weights, and the whole from them.

  On `ModelWeights` structures (numpy values or tensors in a graph); the
  body carries the non-trainable weights (they travel with it).
  """

  def __init__(self, head_variables: int):
    self.head = parts.head(head_variables)
    self._n = head_variables

  def body(self, weights) -> ModelWeights:
    return ModelWeights(trainable=list(weights.trainable[:-self._n]),
                        non_trainable=list(weights.non_trainable))

  def join(self, body, head) -> ModelWeights:
    return ModelWeights(trainable=[*body.trainable, *head.trainable],
                        non_trainable=list(body.non_trainable))


def _bytes(structure) -> tf.Tensor:
  """int64: the size of a structure's tensors, uncompressed, in bytes."""
  return tf.add_n([tf.size(t, out_type=tf.int64) * t.dtype.size
                   for t in tf.nest.flatten(structure)])


def _check_count(name: str, value, minimum: int) -> None:
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < minimum):
    raise ValueError(f'{name} must be an int >= {minimum}, got {value!r}.')


def build_body_distributor(
    weights_type: tff.Type, head_variables: int, *, whole: bool = False
) -> tff.learning.templates.DistributionProcess:
  """Broadcasts the server model's body (with `whole`: the whole model).

  `next`: `(<()@SERVER, W@SERVER> -> <state=()@SERVER, result={B or
  W}@CLIENTS, measurements=()@SERVER>)`, B the body's `ModelWeights` (its
  trainable variables and every non-trainable one).
  """
  if whole:
    return tff.learning.templates.build_broadcast_process(weights_type)
  split = _Split(head_variables)

  @tff.tensorflow.computation(weights_type)
  def body_of(weights):
    return split.body(weights)

  broadcast = tff.learning.templates.build_broadcast_process(
      body_of.type_signature.result)

  @tff.federated_computation(broadcast.initialize.type_signature.result,
                             tff.FederatedType(weights_type, tff.SERVER))
  def next_fn(state, weights):
    return broadcast.next(state, tff.federated_map(body_of, weights))

  return tff.learning.templates.DistributionProcess(broadcast.initialize,
                                                    next_fn)


def build_body_finalizer(
    server_optimizer: tff.learning.optimizers.Optimizer,
    weights_type: tff.Type, head_variables: int,
) -> tff.learning.templates.FinalizerProcess:
  """The server optimizer applied to the body; the server's head is kept.

  TFF's `build_apply_optimizer_finalizer` over the body (its state,
  hyperparameters and measurements; a non-finite update is rejected).
  `next`: `(<S@SERVER, W@SERVER, body update@SERVER> -> <state=S@SERVER,
  result=W@SERVER, measurements=M@SERVER>)`.
  """
  split = _Split(head_variables)

  @tff.tensorflow.computation(weights_type)
  def body_of(weights):
    return split.body(weights)

  body_type = body_of.type_signature.result
  on_body = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, body_type)

  @tff.tensorflow.computation(weights_type, body_type)
  def with_body(weights, body):
    return split.join(body, split.head.extract(weights))

  @tff.federated_computation(on_body.initialize.type_signature.result,
                             tff.FederatedType(weights_type, tff.SERVER),
                             tff.FederatedType(body_type.trainable,
                                               tff.SERVER))
  def next_fn(state, weights, update):
    output = on_body.next(state, tff.federated_map(body_of, weights), update)
    return tff.templates.MeasuredProcessOutput(
        output.state, tff.federated_map(with_body, (weights, output.result)),
        output.measurements)

  return tff.learning.templates.FinalizerProcess(
      on_body.initialize, next_fn, get_hparams_fn=on_body.get_hparams,
      set_hparams_fn=on_body.set_hparams)


def build_fedrep(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    head_variables: int,
    personal_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    head_epochs: int = 1,
    body_epochs: int = 1,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    metrics_aggregator: fed_avg.MetricsAggregator = None,
    client_context: bool = False,
) -> client_outputs.ProcessWithClientOutputs:
  """Builds FedRep (see the module docstring).

  TFF's four parts (`client_outputs.compose`): a broadcast of the
  server's body (`build_body_distributor`; its whole model for plain data
  sets),
  client work training the head then the body, `model_aggregator` over the
  body updates, and the server optimizer applied to the body
  (`build_body_finalizer`). `next` and
  `next_with_client_outputs` take `{C}@CLIENTS` with C = D* by default and
  `<data=D*, attack=A*, model=H>` under `client_context`; their types are
  in the module docstring.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    client_optimizer_fn: Optimizer of the body passes.
    server_optimizer_fn: Applied to the aggregated body update (as a
      gradient); default SGD with learning rate 1.0 (TFF's default).
    head_variables: How many trailing trainable variables form the head
      (`ModelSpec.head_variables`: 2, the output layer's kernel and bias),
      >= 1 and fewer than the model's trainable variables.
    personal_optimizer_fn: Optimizer of the head passes; default
      `client_optimizer_fn`.
    head_epochs: Passes over a client's data training its head, >= 1
      (PFLlib's default 1; the paper's CIFAR-10 setting 10).
    body_epochs: Passes training the body, >= 1 (the paper's 1).
    client_weighting: `NUM_EXAMPLES` (default: examples of the body
      passes) or `UNIFORM`; a non-finite update gets weight 0, as in TFF.
    model_aggregator: Any `tff.aggregators` factory of the body updates
      (default `MeanFactory()`; robust, DP, compression).
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    client_context: Per-client heads and attack specs (module docstring).

  Returns:
    A `client_outputs.ProcessWithClientOutputs`.

  Raises:
    ValueError: For head_variables < 1 or >= the model's trainable
      variables, or head_epochs or body_epochs < 1.
    TypeError: For a `client_weighting` that is not a `ClientWeighting`.
  """
  _check_count('head_epochs', head_epochs, 1)
  _check_count('body_epochs', body_epochs, 1)
  _check_count('head_variables', head_variables, 1)
  fed_avg.check_client_weighting(client_weighting)
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  num_trainable = len(weights_type.trainable)
  if head_variables >= num_trainable:
    raise ValueError(
        f'head_variables must be < the model\'s {num_trainable} trainable'
        f' variables (the rest is the shared body), got {head_variables}.')
  split = _Split(head_variables)
  body_positions = range(num_trainable - head_variables)
  head_positions = range(num_trainable - head_variables, num_trainable)
  personal_optimizer_fn = personal_optimizer_fn or client_optimizer_fn
  listed = ModelWeights(trainable=list(weights_type.trainable),
                        non_trainable=list(weights_type.non_trainable))
  body_type = tff.types.to_type(split.body(listed))
  head_type = tff.types.to_type(split.head.extract(listed))
  data_type = training_loop.data_type_of(model_fn)
  input_type = (fed_avg.context_type(data_type, model=head_type)
                if client_context else data_type)
  received_type = body_type if client_context else weights_type

  @tff.tensorflow.computation(received_type, input_type)
  def client_update(received, client_data):
    if client_context:
      body, head = received, client_data['model']
    else:  # The server's whole model: its head is where the client starts.
      body, head = split.body(received), split.head.extract(received)
    start = split.join(body, head)
    data, spec, _ = fed_avg.read_client_input(
        client_data, client_context, start, derive_seed=False)
    # Two models: the training metrics released are the body passes'.
    head_trained = training_loop.build_training_loop(
        model_fn(), personal_optimizer_fn,
        trained_variables=head_positions)(start, data.repeat(head_epochs))
    trained = training_loop.build_training_loop(
        model_fn(), client_optimizer_fn,
        trained_variables=body_positions)(head_trained['weights'],
                                          data.repeat(body_epochs))
    update, weight = fed_avg.update_and_weight(
        body, dict(trained, weights=split.body(trained['weights'])), spec,
        client_weighting)
    return (tff.learning.templates.ClientResult(update=update,
                                                update_weight=weight),
            trained['metrics'],
            collections.OrderedDict(
                model=split.head.extract(trained['weights']),
                head_loss=head_trained['loss'], body_loss=trained['loss'],
                bytes_sent=_bytes(update)))

  return client_outputs.compose(
      client_outputs.initial_weights_fn(model_fn),
      build_body_distributor(weights_type, head_variables,
                             whole=not client_context),
      client_outputs.build_client_work(
          client_update,
          fed_avg.metrics_aggregation(model_fn, metrics_aggregator),
          summed_outputs=('bytes_sent',)),
      fed_avg.build_update_aggregator(model_aggregator, body_type),
      build_body_finalizer(
          server_optimizer_fn or fed_avg.default_server_optimizer(),
          weights_type, head_variables))
