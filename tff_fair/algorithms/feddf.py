"""FedDF (Lin et al., NeurIPS 2020): FedAvg fused by ensemble distillation.

Clients may hold models of different architectures ("prototypes"). A round:

1. FedAvg per architecture: the server broadcasts each architecture's model
   to the sampled clients of that architecture, they train it locally and
   send their models back (as updates, TFF's `initial - trained`); the
   server averages them into the architecture's model (its aggregator and
   server optimizer, as FedAvg). An architecture no sampled client holds
   keeps its model.
2. Ensemble distillation at the server: the teacher is the mean of the
   logits of every model received this round (all architectures) on the
   server's unlabeled public set. Each architecture's averaged model is
   then trained on the public set to match the teacher's softmax (KL
   divergence, Adam at 1e-3 by default), and the server keeps the version
   with the best accuracy on its labeled validation set, checked every
   `validate_every` steps, stopping after `patience` steps without
   improvement or `steps` steps. The averaged model itself is a candidate
   (step 0), so distillation never leaves a model worse on the server's
   validation set than FedAvg left it.

The server holds the public and validation sets and the received models,
so step 2 is plain TensorFlow at the server (`distill`), outside TFF; step
1 is one TFF process per architecture
(`build_fed_avg_sending_models`), FedAvg's four parts whose clients also
hand back the model they sent.

`build_feddf` returns a `FedDFProcess`, the composite of both, with the
methods of a `tff.learning.templates.LearningProcess` (it is not one: the
distillation is plain TensorFlow at the server between TFF calls). Its
state S is an `OrderedDict` of each architecture's FedAvg state (a
structure of arrays, which `tff.program.FileProgramStateManager` saves as
it is):

    initialize:        ( -> S@SERVER)
    next:              (<S@SERVER, {architecture: {C}@CLIENTS}> ->
                        <state=S@SERVER, metrics=M@SERVER>)
    get_model_weights: (S -> {architecture: ModelWeights})
    set_model_weights: (<S, {architecture: ModelWeights}> -> S)
    C = D* (plain batched data sets, TFF's default) or, with
        `client_context=True`, `fed_avg.client_input(dataset, attack)`
        (a malicious client's update, and so the model the server
        receives, is attacked)

M holds, per architecture, `fedavg` (that process's metrics, when it had
clients) and `distillation` (`steps` run, `best_step` kept,
`validation_accuracy_before` and `validation_accuracy` of the kept model,
`loss`: the KL divergence to the teacher over the last steps),
`ensemble` (`size`, and the teacher's `validation_accuracy`), and
`client_work/train`: the clients' training metrics over every
architecture. With one architecture FedDF is FedAvg plus the server's
distillation into its model.
"""

import collections
from collections.abc import Callable, Mapping, Sequence
import hashlib
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import distillation
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import training_loop

ModelWeights = tff.learning.models.ModelWeights


def build_fed_avg_sending_models(
    model_fn: distillation.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    metrics_aggregator: fed_avg.MetricsAggregator = None,
    client_context: bool = False,
) -> client_outputs.ProcessWithClientOutputs:
  """FedAvg whose clients also hand back the model they sent.

  The round and state of `fed_avg.build_fed_avg` (same arguments);
  `next_with_client_outputs` also returns, per client, `O = <model=W,
  weight=float32>`: the model the server received (the broadcast model
  minus the update sent, attacked under `client_context`) and its
  aggregation weight (0 for a non-finite update, which TFF zeroes).
  """
  fed_avg.check_client_weighting(client_weighting)
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  input_type = fed_avg.client_input_type(model_fn, client_context)

  @tff.tensorflow.computation(weights_type, input_type)
  def client_update(initial_weights, client_data):
    data, spec, _ = fed_avg.read_client_input(
        client_data, client_context, initial_weights, derive_seed=False)
    trained = training_loop.build_training_loop(
        model_fn(), client_optimizer_fn)(initial_weights, data)
    update, weight = fed_avg.update_and_weight(initial_weights, trained,
                                               spec, client_weighting)
    sent = client_outputs.apply_update(initial_weights, update)
    return (tff.learning.templates.ClientResult(update=update,
                                                update_weight=weight),
            trained['metrics'],
            collections.OrderedDict(model=sent, weight=weight))

  @tff.tensorflow.computation
  def initial_weights():
    return ModelWeights.from_model(model_fn())

  return client_outputs.compose(
      initial_weights,
      tff.learning.templates.build_broadcast_process(weights_type),
      client_outputs.build_client_work(
          client_update,
          fed_avg.metrics_aggregation(model_fn, metrics_aggregator)),
      fed_avg.build_update_aggregator(model_aggregator, weights_type),
      tff.learning.templates.build_apply_optimizer_finalizer(
          server_optimizer_fn or fed_avg.default_server_optimizer(),
          weights_type))


def _batch_rows(count: int, rows: int,
                rng: np.random.Generator) -> np.ndarray:
  """`rows` positions of `count` examples: epochs of fresh permutations."""
  epochs = -(-rows // count)
  return np.concatenate([rng.permutation(count)
                         for _ in range(epochs)])[:rows]


def distill(
    model_fn: distillation.ModelFn,
    start: ModelWeights,
    teacher: np.ndarray,
    public_x: np.ndarray,
    validation: tuple[np.ndarray, np.ndarray],
    *,
    optimizer: tff.learning.optimizers.Optimizer,
    steps: int,
    validate_every: int,
    patience: int,
    batch_size: int,
    seed: Sequence[int],
) -> tuple[ModelWeights, collections.OrderedDict]:
  """FedDF's server step for one architecture, in plain TensorFlow.

  Trains `start` on batches of the public set (epochs of seeded
  permutations) to match the teacher's softmax (KL divergence) and keeps
  the version most accurate on `validation`: `start` itself (step 0), or
  the model after any multiple of `validate_every` steps (a later one only
  if strictly better). Stops after `steps` steps, or once `patience` steps
  have passed since the kept version.

  Args:
    model_fn: The architecture's model builder.
    start: The model to distill into (FedAvg's average).
    teacher: float32[N, classes], the ensemble's logits on `public_x`.
    public_x: The N public examples.
    validation: (x, y) of the server's labeled validation set.
    optimizer: The distillation's optimizer (FedDF: Adam, 1e-3).
    steps: At most this many steps (0: `start` is kept).
    validate_every: Steps between validations, >= 1.
    patience: Steps without a better validation accuracy that stop it.
    batch_size: Public examples per step.
    seed: Seeds the batches' order.

  Returns:
    (the kept weights, OrderedDict(steps, best_step,
    validation_accuracy_before, validation_accuracy, loss)): `loss` is the
    mean KL divergence to the teacher over the last `validate_every` steps
    (each before its step; NaN without a step).
  """
  logits = distillation.Logits(model_fn)
  val_x, val_y = validation

  def accuracy(weights) -> float:
    return float(np.mean(logits(weights, val_x).argmax(-1) == val_y))

  before = best_accuracy = accuracy(start)
  best, best_step, step, loss = start, 0, 0, float('nan')
  if steps:
    fit = distillation.build_fitting_loop(logits.model, optimizer,
                                          distillation.kl_divergence)
    rng = np.random.default_rng(list(seed))
    weights, optimizer_state = start, None
    while step < steps and step - best_step < patience:
      chunk = min(validate_every, steps - step)
      rows = _batch_rows(len(public_x), chunk * batch_size, rng)
      result = fit(weights, tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(x=public_x[rows], logits=teacher[rows])
      ).batch(batch_size), optimizer_state)
      weights, optimizer_state = result['weights'], result['optimizer_state']
      loss = float(result['loss'])
      step += chunk
      now = accuracy(weights)
      if now > best_accuracy:
        best, best_accuracy, best_step = weights, now, step
  best = client_outputs.as_model_weights(best)
  return best, collections.OrderedDict(
      steps=step, best_step=best_step, validation_accuracy_before=before,
      validation_accuracy=best_accuracy, loss=loss)


# A round without a received model distils nothing.
_NOT_DISTILLED = collections.OrderedDict(
    steps=0, best_step=0, validation_accuracy_before=float('nan'),
    validation_accuracy=float('nan'), loss=float('nan'))


def _fingerprint(array: np.ndarray) -> int:
  """A seed from an array's bytes: the same inputs give the same batches."""
  return int.from_bytes(hashlib.sha256(array.tobytes()).digest()[:8],
                        'little')


class FedDFProcess:
  """FedAvg per architecture, then the server's ensemble distillation.

  See the module docstring. Built by `build_feddf`.

  Attributes:
    processes: Architecture -> its FedAvg process
      (`build_fed_avg_sending_models`).
  """

  def __init__(self,
               processes: Mapping[str, client_outputs.ProcessWithClientOutputs],
               model_fns: Mapping[str, distillation.ModelFn],
               public_x: np.ndarray,
               validation: tuple[np.ndarray, np.ndarray],
               distill_fn: Callable[..., tuple[ModelWeights,
                                               collections.OrderedDict]]):
    self.processes = collections.OrderedDict(processes)
    self._model_fns = dict(model_fns)
    self._public_x = public_x
    self._validation = validation
    self._distill = distill_fn

  def initialize(self) -> collections.OrderedDict:
    """Each architecture's initial FedAvg state."""
    return collections.OrderedDict(
        (name, process.initialize())
        for name, process in self.processes.items())

  def get_model_weights(self, state: Mapping[str, Any]
                        ) -> collections.OrderedDict:
    """Architecture -> its server model."""
    return collections.OrderedDict(
        (name, process.get_model_weights(state[name]))
        for name, process in self.processes.items())

  def set_model_weights(self, state: Mapping[str, Any],
                        weights: Mapping[str, ModelWeights]
                        ) -> collections.OrderedDict:
    """`state` with the server models of the architectures in `weights`."""
    self._check_names(weights)
    return collections.OrderedDict(
        (name, process.set_model_weights(state[name], weights[name])
         if name in weights else state[name])
        for name, process in self.processes.items())

  def _check_names(self, mapping: Mapping[str, Any]) -> None:
    unknown = sorted(set(mapping) - set(self.processes))
    if unknown:
      raise ValueError(f'Unknown architecture(s) {unknown}; this process'
                       f' has {list(self.processes)}.')

  def next(self, state: Mapping[str, Any],
           client_data: Mapping[str, Sequence[Any]]
           ) -> tff.learning.templates.LearningProcessOutput:
    """One round (module docstring).

    Args:
      state: The state the round starts from.
      client_data: Architecture -> its sampled clients' inputs (an
        architecture may be left out: none of its clients was sampled).

    Returns:
      The new state and the round's metrics.
    """
    self._check_names(client_data)
    state = collections.OrderedDict(state)
    metrics = collections.OrderedDict(
        (name, collections.OrderedDict()) for name in self.processes)
    received, train = [], []
    for name, process in self.processes.items():
      inputs = list(client_data.get(name, ()))
      if not inputs:
        continue
      output = process.next_with_client_outputs(state[name], inputs)
      state[name] = output.state
      metrics[name]['fedavg'] = output.metrics
      train.append(output.metrics['client_work']['train'])
      received += [(name, client_outputs.as_model_weights(client['model']))
                   for client in output.clients if client['weight'] > 0]
    ensemble = collections.OrderedDict(size=len(received),
                                       validation_accuracy=float('nan'))
    for name in self.processes:  # The same fields in every round.
      metrics[name]['distillation'] = _NOT_DISTILLED.copy()
    if received:
      count = len(self._public_x)
      val_x, val_y = self._validation
      # One pass of each received model over both sets.
      logits = distillation.teacher_logits(
          received, self._model_fns,
          np.concatenate([self._public_x, val_x]))
      teacher = logits[:count]
      ensemble['validation_accuracy'] = float(
          np.mean(logits[count:].argmax(-1) == val_y))
      seed = _fingerprint(teacher)
      for index, (name, process) in enumerate(self.processes.items()):
        weights, metrics[name]['distillation'] = self._distill(
            self._model_fns[name], process.get_model_weights(state[name]),
            teacher, self._public_x, self._validation, seed=(seed, index))
        state[name] = process.set_model_weights(state[name], weights)
    metrics['ensemble'] = ensemble
    metrics['client_work'] = collections.OrderedDict(
        train=distillation.combine_train_metrics(train))
    return tff.learning.templates.LearningProcessOutput(state, metrics)


def build_feddf(
    model_fns: Mapping[str, distillation.ModelFn],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    public_x: np.ndarray,
    validation: tuple[np.ndarray, np.ndarray],
    distillation_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    distillation_steps: int = 1000,
    validate_every: int = 50,
    patience: int = 200,
    distillation_batch_size: int = 64,
    client_weighting: fed_avg.ClientWeighting = (
        fed_avg.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    metrics_aggregator: fed_avg.MetricsAggregator = None,
    client_context: bool = False,
) -> FedDFProcess:
  """Builds FedDF over one or more architectures (module docstring).

  Args:
    model_fns: Architecture name -> a no-arg callable returning a fresh
      `VariableModel` of it; every architecture reads the same data and
      predicts the same classes.
    client_optimizer_fn: The clients' local optimizer.
    server_optimizer_fn: FedAvg's server optimizer; default SGD at 1.0.
    public_x: The server's unlabeled public examples (N of them).
    validation: (x, y) of the server's labeled validation set, for early
      stopping.
    distillation_optimizer: Default `tff.learning.optimizers.build_adam(
      1e-3)`, the paper's.
    distillation_steps: Most steps of distillation per architecture and
      round (0: FedAvg per architecture, the teacher only measured).
    validate_every: Steps between validations of the student.
    patience: Steps without a better validation accuracy that stop it.
    distillation_batch_size: Public examples per step.
    client_weighting: As in `fed_avg.build_fed_avg`.
    model_aggregator: As in `fed_avg.build_fed_avg` (every architecture's).
    metrics_aggregator: As in `fed_avg.build_fed_avg`.
    client_context: Clients' inputs carry attack specs
      (`fed_avg.client_input`); default plain data sets.

  Returns:
    A `FedDFProcess`.

  Raises:
    ValueError: For no architecture, an empty public or validation set,
      or a count out of range.
  """
  if not model_fns:
    raise ValueError('model_fns must name at least one architecture.')
  if not len(public_x):
    raise ValueError('FedDF needs a non-empty public set to distill on.')
  val_x, val_y = validation
  if not len(val_y) or len(val_x) != len(val_y):
    raise ValueError('validation must be (x, y) of at least one example,'
                     f' got {len(val_x)} examples and {len(val_y)} labels.')
  distillation.check_int('distillation_steps', distillation_steps, 0)
  distillation.check_int('validate_every', validate_every, 1)
  distillation.check_int('patience', patience, 1)
  distillation.check_int('distillation_batch_size', distillation_batch_size, 1)
  processes = collections.OrderedDict(
      (name, build_fed_avg_sending_models(
          model_fn, client_optimizer_fn, server_optimizer_fn,
          client_weighting=client_weighting,
          model_aggregator=model_aggregator,
          metrics_aggregator=metrics_aggregator,
          client_context=client_context))
      for name, model_fn in model_fns.items())
  optimizer = (distillation_optimizer
               or tff.learning.optimizers.build_adam(learning_rate=1e-3))

  def distill_fn(model_fn, start, teacher, x, held_out, seed):
    return distill(model_fn, start, teacher, x, held_out,
                   optimizer=optimizer, steps=distillation_steps,
                   validate_every=validate_every, patience=patience,
                   batch_size=distillation_batch_size, seed=seed)

  return FedDFProcess(processes, model_fns, np.asarray(public_x),
                      (np.asarray(val_x), np.asarray(val_y)), distill_fn)
