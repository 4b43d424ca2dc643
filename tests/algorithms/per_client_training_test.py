"""Per-client training (fine-tuning / standalone) on real digits."""

import collections

import numpy as np
from sklearn import datasets as sk_datasets
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tff_fair.algorithms import per_client_training
from tff_fair.evaluation import per_client
from tff_fair.models import model_fns


def _client_arrays(num_clients, per_client_examples):
  digits = sk_datasets.load_digits()
  x = (digits.images / 16.0).astype(np.float32)[..., None]
  y = digits.target.astype(np.int32)
  return [(x[i * per_client_examples:(i + 1) * per_client_examples],
           y[i * per_client_examples:(i + 1) * per_client_examples])
          for i in range(num_clients)]


def _dataset(x, y):
  return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=y)).batch(16)


class PerClientTrainingTest(tff_test_utils.TffTestCase):

  def setUp(self):
    super().setUp()
    self.spec = model_fns.build_model_spec(
        'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
        num_classes=10)
    self.evaluator = per_client.ClientEvaluator(self.spec.build_keras)

  def test_type_signature(self):
    comp = per_client_training.build_per_client_training(
        self.spec.model_fn, tff.learning.optimizers.build_sgdm(0.1), 1)
    self.assertEqual(comp.type_signature.parameter[0].placement, tff.SERVER)
    self.assertEqual(comp.type_signature.parameter[1].placement, tff.CLIENTS)
    self.assertEqual(comp.type_signature.result.placement, tff.CLIENTS)
    self.assertFalse(comp.type_signature.result.all_equal)

  def test_each_client_fits_its_own_data(self):
    arrays = _client_arrays(num_clients=3, per_client_examples=150)
    comp = per_client_training.build_per_client_training(
        self.spec.model_fn, tff.learning.optimizers.build_adam(0.01), 8)
    initial = self.spec.initial_weights(seed=3)
    trained = comp(initial, [_dataset(*a) for a in arrays])
    self.assertLen(trained, 3)
    for (x, y), weights in zip(arrays, trained):
      before = self.evaluator.evaluate(initial, x, y)
      after = self.evaluator.evaluate(weights, x, y)
      self.assertLess(after.loss, 0.5 * before.loss)
      self.assertGreater(after.accuracy, 0.8)
    # Different data, different personal models.
    self.assertNotAllClose(trained[0].trainable[0], trained[1].trainable[0])

  def test_same_data_same_model_and_order_kept(self):
    (x, y), = _client_arrays(num_clients=1, per_client_examples=64)
    comp = per_client_training.build_per_client_training(
        self.spec.model_fn, tff.learning.optimizers.build_sgdm(0.05), 1)
    initial = self.spec.initial_weights(seed=0)
    a, b, c = comp(initial, [_dataset(x, y), _dataset(x[:1], y[:1]),
                             _dataset(x, y)])
    self.assertAllClose(a.trainable, c.trainable)
    self.assertNotAllClose(a.trainable[-1], b.trainable[-1])

  def test_epochs_must_be_positive(self):
    with self.assertRaisesRegex(ValueError, 'epochs must be >= 1'):
      per_client_training.build_per_client_training(
          self.spec.model_fn, tff.learning.optimizers.build_sgdm(0.1), 0)
    with self.assertRaisesRegex(ValueError, 'exactly one'):
      per_client_training.build_per_client_training(
          self.spec.model_fn, tff.learning.optimizers.build_sgdm(0.1), 1,
          steps=1)

  def test_steps_are_batches_cycling_through_the_data(self):
    # 3 steps on a client of 2 batches: batch 1, batch 2, batch 1 again,
    # each one SGD step, against the same steps taken eagerly.
    (x, y), = _client_arrays(num_clients=1, per_client_examples=20)
    comp = per_client_training.build_per_client_training(
        self.spec.model_fn, tff.learning.optimizers.build_sgdm(0.1),
        steps=3)
    initial = self.spec.initial_weights(seed=0)
    (trained,) = comp(initial, [_dataset(x, y)])
    model = self.spec.build_keras(0)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.SGD(0.1)
    for rows in (slice(0, 16), slice(16, 20), slice(0, 16)):
      with tf.GradientTape() as tape:
        value = loss(y[rows], model(x[rows]))
      optimizer.apply_gradients(zip(
          tape.gradient(value, model.trainable_variables),
          model.trainable_variables))
    self.assertAllClose(trained.trainable,
                        [v.numpy() for v in model.trainable_variables],
                        atol=1e-5)


if __name__ == '__main__':
  tf.test.main()
