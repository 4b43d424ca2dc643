"""Per-client evaluation on each client's own test split.

Evaluation runs the Keras architecture directly (one model, one traced
prediction function, weights swapped per client) rather than as a federated
computation: personalized evaluation needs a different model per client,
and in simulation the test data already lives with the driver. The metrics
match what `tff.learning` trains with: mean sparse cross-entropy on logits
and accuracy; plus balanced accuracy (mean per-class recall over the classes
present in that client's test labels), which label-skewed clients need.

For sequence targets (next-character prediction) positions whose label is
padding (`model_fns.PAD_LABEL`) are ignored, as in training.
"""

from collections.abc import Callable, Iterable, Mapping
import dataclasses
import math
from typing import Optional, Union

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.evaluation import statistics
from tff_fair.models import model_fns

WeightsSource = Union[tff.learning.models.ModelWeights,
                      Mapping[str, tff.learning.models.ModelWeights],
                      Callable[[str], tff.learning.models.ModelWeights]]


@dataclasses.dataclass(frozen=True)
class ClientMetrics:
  loss: float
  accuracy: float
  balanced_accuracy: float
  num_examples: int


def balanced_accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
  """Mean recall over the classes present in `labels`."""
  labels = np.asarray(labels).ravel()
  predictions = np.asarray(predictions).ravel()
  recalls = [
      np.mean(predictions[labels == c] == c) for c in np.unique(labels)
  ]
  return float(np.mean(recalls))


class ClientEvaluator:
  """Evaluates model weights on arrays, one Keras model per batch of work.

  The Keras model is built anew for each `evaluate_clients` call rather than
  once: building a model inside a graph (as TFF does whenever it traces a
  computation) invalidates Keras models made before it.
  """

  def __init__(
      self, build_keras: Callable[[Optional[int]], tf.keras.Model],
      batch_size: int = 512,
      input_fn: Optional[Callable[[tf.Tensor], object]] = None,
  ):
    """Creates an evaluator.

    Args:
      build_keras: `seed -> tf.keras.Model` of the architecture.
      batch_size: Examples per forward pass.
      input_fn: Maps a batch of features to the model's input (e.g. adds a
        slimmable model's width); default: the features themselves.
    """
    self._build_keras = build_keras
    self._batch_size = batch_size
    self._input_fn = input_fn or (lambda x: x)

  def evaluate(
      self, weights: tff.learning.models.ModelWeights, x: np.ndarray,
      y: np.ndarray
  ) -> ClientMetrics:
    """Loss, accuracy and balanced accuracy of `weights` on `(x, y)`."""
    return self.evaluate_clients(weights, ['_'], lambda _: (x, y))['_']

  def evaluate_clients(
      self,
      weights: WeightsSource,
      client_ids: Iterable[str],
      test_arrays: Callable[[str], tuple[np.ndarray, np.ndarray]],
  ) -> dict[str, ClientMetrics]:
    """Evaluates one global model, or one model per client, per client.

    Args:
      weights: One `ModelWeights` for all clients, a mapping client id ->
        weights, or a callable returning a client's weights (e.g. reading a
        disk-backed store lazily).
      client_ids: Clients to evaluate.
      test_arrays: `client_id -> (x, y)` of that client's own test split.

    Returns:
      Client id -> `ClientMetrics`, in the order of `client_ids`.
    """
    model = self._build_keras(None)
    logits_fn = None
    results = {}
    for cid in client_ids:
      x, y = test_arrays(cid)
      if logits_fn is None:
        # Clients' test sets differ in size: one trace for every batch size.
        logits_fn = tf.function(
            lambda batch: model(self._input_fn(batch), training=False),
            input_signature=[tf.TensorSpec([None, *x.shape[1:]], x.dtype)])
      if len(y) == 0:
        raise ValueError(
            f'Client {cid!r} has an empty test split; give every client test'
            ' examples (raise test_fraction or examples_per_client).'
        )
      weights_for_client(weights, cid).assign_weights_to(model)
      logits = np.concatenate([
          logits_fn(tf.constant(x[i:i + self._batch_size])).numpy()
          for i in range(0, len(x), self._batch_size)
      ])
      results[cid] = _metrics(logits, np.asarray(y))
    return results


def _metrics(logits: np.ndarray, labels: np.ndarray) -> ClientMetrics:
  mask = (labels != model_fns.PAD_LABEL if labels.ndim > 1
          else np.ones(labels.shape, bool))
  flat_logits, flat_labels = logits[mask], labels[mask]
  losses = tf.keras.losses.sparse_categorical_crossentropy(
      flat_labels, flat_logits, from_logits=True
  ).numpy()
  predictions = flat_logits.argmax(axis=-1)
  return ClientMetrics(
      loss=float(losses.mean()),
      accuracy=float(np.mean(predictions == flat_labels)),
      balanced_accuracy=balanced_accuracy(flat_labels, predictions),
      num_examples=int(len(labels)),
  )


def weights_for_client(source: WeightsSource, client_id: str
                       ) -> tff.learning.models.ModelWeights:
  """The weights `source` gives `client_id` (one model, a mapping or a
  callable)."""
  if isinstance(source, tff.learning.models.ModelWeights):
    return source
  if isinstance(source, Mapping):
    if client_id not in source:
      raise KeyError(f'No model weights for client {client_id!r}.')
    return source[client_id]
  return source(client_id)


def summarize_clients(
    metrics: Mapping[str, ClientMetrics]
) -> dict[str, statistics.ClientStatistics]:
  """Statistics over clients of loss, accuracy and balanced accuracy.

  A model that diverged has a non-finite loss on a client's examples (its
  accuracy is still defined): the loss statistics are then NaN
  (`statistics.undefined`), and a warning names the clients.
  """
  if not metrics:
    raise ValueError('No client metrics to summarize.')
  sizes = [m.num_examples for m in metrics.values()]
  diverged = [cid for cid, m in metrics.items()
              if m.num_examples and not math.isfinite(m.loss)]
  if diverged:
    logging.warning(
        'The model(s) of %d of %d client(s) diverged (a non-finite test'
        ' loss: %s); their loss statistics are NaN. Lower the learning'
        ' rates.', len(diverged), len(metrics),
        ', '.join(diverged[:10]) + (', ...' if len(diverged) > 10 else ''))
  return {
      name: (statistics.undefined(len(sizes)) if name == 'loss' and diverged
             else statistics.summarize(
                 [getattr(m, name) for m in metrics.values()], weights=sizes,
                 higher_is_better=(name != 'loss')))
      for name in ('loss', 'accuracy', 'balanced_accuracy')
  }


def format_table(metrics: Mapping[str, ClientMetrics]) -> str:
  """A plain-text table: one row per client, then the summary statistics."""
  lines = [
      f'{"client":<24}{"examples":>9}{"loss":>9}{"accuracy":>10}'
      f'{"bal.acc":>9}'
  ]
  for cid, m in metrics.items():
    lines.append(
        f'{cid:<24}{m.num_examples:>9d}{m.loss:>9.4f}{m.accuracy:>10.4f}'
        f'{m.balanced_accuracy:>9.4f}'
    )
  summary = summarize_clients(metrics)
  lines.append('')
  lines.append(
      f'{"statistic":<24}{"loss":>9}{"accuracy":>10}{"bal.acc":>9}'
  )
  for stat in ('mean', 'weighted_mean', 'variance', 'worst_10_mean',
               'best_10_mean', 'worst'):
    row = [getattr(summary[n], stat) for n in
           ('loss', 'accuracy', 'balanced_accuracy')]
    lines.append(f'{stat:<24}{row[0]:>9.4f}{row[1]:>10.4f}{row[2]:>9.4f}')
  lines.append('bal.acc: balanced accuracy, the mean recall over the classes'
               ' in a client\'s test split. worst_10_mean: mean of the worst'
               ' 10% of clients (highest losses, lowest accuracies); worst:'
               ' the worst client.')
  return '\n'.join(lines)
