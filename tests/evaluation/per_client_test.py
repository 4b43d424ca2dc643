"""Per-client evaluation against hand-computed values on real digits."""

import numpy as np
from sklearn import datasets as sk_datasets
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.evaluation import per_client
from tff_fair.models import model_fns


def _digits():
  digits = sk_datasets.load_digits()
  x = (digits.images / 16.0).astype(np.float32)[..., None]
  return x, digits.target.astype(np.int32)


def _constant_prediction_weights(spec, bias):
  """Weights whose logits are `bias` for every input (zero kernels)."""
  w = spec.initial_weights(seed=0)
  trainable = [np.zeros_like(v) for v in w.trainable]
  trainable[-1] = np.asarray(bias, np.float32)
  return tff.learning.models.ModelWeights(trainable, list(w.non_trainable))


class BalancedAccuracyTest(tf.test.TestCase):

  def test_hand_computed(self):
    labels = np.array([0, 0, 0, 0, 1, 1, 2])
    predictions = np.array([0, 0, 0, 1, 1, 0, 2])
    # Recalls: class 0 3/4, class 1 1/2, class 2 1/1.
    self.assertAlmostEqual(
        per_client.balanced_accuracy(labels, predictions),
        (0.75 + 0.5 + 1.0) / 3)

  def test_ignores_classes_absent_from_labels(self):
    self.assertAlmostEqual(
        per_client.balanced_accuracy([1, 1, 1], [1, 1, 5]), 2 / 3)


class ClientEvaluatorTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.spec = model_fns.build_model_spec(
        'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
        num_classes=10)
    self.evaluator = per_client.ClientEvaluator(self.spec.build_keras,
                                                batch_size=64)
    self.x, self.y = _digits()

  def test_constant_model_metrics_match_hand_computation(self):
    bias = np.zeros(10, np.float32)
    bias[3] = 2.0
    weights = _constant_prediction_weights(self.spec, bias)
    x, y = self.x[:300], self.y[:300]
    m = self.evaluator.evaluate(weights, x, y)
    log_softmax = bias - np.log(np.exp(bias).sum())
    self.assertAllClose(m.loss, -log_softmax[y].mean(), atol=1e-5)
    self.assertAlmostEqual(m.accuracy, np.mean(y == 3))
    self.assertAlmostEqual(m.balanced_accuracy, 1 / len(np.unique(y)))
    self.assertEqual(m.num_examples, 300)

  def test_one_model_per_client(self):
    to_3 = np.zeros(10, np.float32)
    to_3[3] = 1.0
    to_5 = np.zeros(10, np.float32)
    to_5[5] = 1.0
    weights = {'a': _constant_prediction_weights(self.spec, to_3),
               'b': _constant_prediction_weights(self.spec, to_5)}
    arrays = {'a': (self.x[:100], self.y[:100]),
              'b': (self.x[100:200], self.y[100:200])}
    result = self.evaluator.evaluate_clients(
        weights, ['a', 'b'], arrays.__getitem__)
    self.assertEqual(list(result), ['a', 'b'])
    self.assertAlmostEqual(result['a'].accuracy, np.mean(self.y[:100] == 3))
    self.assertAlmostEqual(result['b'].accuracy,
                           np.mean(self.y[100:200] == 5))
    summary = per_client.summarize_clients(result)
    self.assertAlmostEqual(
        summary['accuracy'].mean,
        (result['a'].accuracy + result['b'].accuracy) / 2)
    table = per_client.format_table(result)
    self.assertIn('worst_10_mean', table)
    # The worst row holds the highest loss and the lowest accuracy.
    worst_row = next(l for l in table.splitlines() if l.startswith('worst '))
    loss, accuracy = (float(v) for v in worst_row.split()[1:3])
    self.assertAlmostEqual(loss, max(m.loss for m in result.values()),
                           places=4)
    self.assertAlmostEqual(accuracy,
                           min(m.accuracy for m in result.values()), places=4)
    self.assertIn('bal.acc: balanced accuracy', table)

  def test_missing_client_weights(self):
    with self.assertRaisesRegex(KeyError, "'c'"):
      self.evaluator.evaluate_clients(
          {}, ['c'], lambda _: (self.x[:5], self.y[:5]))

  def test_empty_test_split_is_an_error(self):
    weights = self.spec.initial_weights(seed=0)
    with self.assertRaisesRegex(ValueError, 'empty test split'):
      self.evaluator.evaluate(weights, self.x[:0], self.y[:0])


class SummarizeClientsTest(tf.test.TestCase):

  def test_a_diverged_model_leaves_loss_undefined_and_is_named(self):
    # A model with infinite logits: its loss on real digits is NaN.
    spec = model_fns.build_model_spec(
        'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
        num_classes=10)
    x, y = _digits()
    diverged = per_client.ClientEvaluator(spec.build_keras).evaluate(
        _constant_prediction_weights(spec, [np.inf] * 5 + [0.0] * 5),
        x[:20], y[:20])
    self.assertTrue(np.isnan(diverged.loss))
    healthy = per_client.ClientMetrics(
        num_examples=10, loss=1.5, accuracy=0.5, balanced_accuracy=0.5)
    with self.assertLogs(level='WARNING') as logs:
      stats = per_client.summarize_clients({'a': healthy, 'b': diverged})
    self.assertIn('diverged', logs.output[0])
    self.assertIn('b', logs.output[0].split('loss:')[1])
    self.assertTrue(np.isnan(stats['loss'].mean))
    self.assertEqual(stats['loss'].count, 2)
    self.assertAlmostEqual(stats['accuracy'].mean,
                           (0.5 + diverged.accuracy) / 2)

  def test_a_client_without_test_examples_is_still_an_error(self):
    empty = per_client.ClientMetrics(
        num_examples=0, loss=np.nan, accuracy=np.nan,
        balanced_accuracy=np.nan)
    with self.assertRaisesRegex(ValueError, 'NaN'):
      per_client.summarize_clients({'a': empty})


if __name__ == '__main__':
  tf.test.main()
