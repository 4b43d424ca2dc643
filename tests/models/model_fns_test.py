"""Architectures build, have the expected outputs, and wrap for TFF."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.models import model_fns

_CASES = (
    ('lenet', dict(x_shape=(28, 28, 1), x_dtype=tf.float32, y_shape=(),
                   num_classes=10), (10,)),
    ('lenet', dict(x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
                   num_classes=10), (10,)),
    ('cifar_cnn', dict(x_shape=(32, 32, 3), x_dtype=tf.float32, y_shape=(),
                       num_classes=10), (10,)),
    ('ditto_cnn', dict(x_shape=(28, 28, 1), x_dtype=tf.float32, y_shape=(),
                       num_classes=10), (10,)),
    ('ditto_cnn', dict(x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
                       num_classes=10), (10,)),
    ('fedavg_cnn', dict(x_shape=(28, 28, 1), x_dtype=tf.float32, y_shape=(),
                        num_classes=10), (10,)),
    ('mlp', dict(x_shape=(28, 28, 1), x_dtype=tf.float32, y_shape=(),
                 num_classes=10), (10,)),
    ('mlp', dict(x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
                 num_classes=10), (10,)),
    ('text_cnn', dict(x_shape=(20,), x_dtype=tf.int32, y_shape=(),
                      num_classes=2, vocab_size=100), (2,)),
    ('char_lstm', dict(x_shape=(12,), x_dtype=tf.int32, y_shape=(12,),
                       num_classes=90, vocab_size=90), (12, 90)),
)


class ModelSpecTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*_CASES)
  def test_logits_shape_and_tff_wrapper(self, name, kwargs, out_shape):
    spec = model_fns.build_model_spec(name, **kwargs)
    model = spec.build_keras(0)
    dtype = kwargs['x_dtype'].as_numpy_dtype
    x = np.ones((3, *kwargs['x_shape']), dtype)
    self.assertEqual(model(x).shape, (3, *out_shape))
    variable_model = spec.model_fn()
    self.assertIsInstance(variable_model, tff.learning.models.VariableModel)
    weights_type = tff.learning.models.weights_type_from_model(spec.model_fn)
    self.assertLen(weights_type.trainable, len(model.trainable_variables))
    # The head is the output layer: the last trainable variables.
    output_layer = [layer for layer in model.layers if layer.weights][-1]
    head = model.trainable_variables[-spec.head_variables:]
    self.assertEqual([v.name for v in head],
                     [v.name for v in output_layer.trainable_variables])
    self.assertEqual(head[-1].shape[-1], out_shape[-1])

  def test_initial_weights_are_seeded(self):
    spec = model_fns.build_model_spec(*_CASES[0][:2][:1], **_CASES[0][1])
    a, b, c = (spec.initial_weights(s) for s in (1, 1, 2))
    for x, y in zip(a.trainable, b.trainable):
      self.assertAllEqual(x, y)
    self.assertNotAllClose(a.trainable[0], c.trainable[0])

  @parameterized.parameters(
      # Weight shapes of the Ditto reference code's Fashion-MNIST CNN and of
      # PFLlib's FedAvgCNN (28x28 inputs: 7x7x64 and 4x4x64 features).
      ('ditto_cnn', [(5, 5, 1, 32), (32,), (5, 5, 32, 64), (64,),
                     (7 * 7 * 64, 1024), (1024,), (1024, 10), (10,)]),
      ('fedavg_cnn', [(5, 5, 1, 32), (32,), (5, 5, 32, 64), (64,),
                      (4 * 4 * 64, 512), (512,), (512, 10), (10,)]),
      # The FedAvg paper's 2NN: 199,210 parameters on 28x28 inputs.
      ('mlp', [(784, 200), (200,), (200, 200), (200,), (200, 10), (10,)]),
  )
  def test_reference_model_shapes(self, name, shapes):
    spec = model_fns.build_model_spec(name, x_shape=(28, 28, 1),
                                      x_dtype=tf.float32, y_shape=(),
                                      num_classes=10)
    self.assertEqual([w.shape for w in spec.initial_weights(0).trainable],
                     shapes)

  def test_fedavg_cnn_rejects_small_inputs(self):
    spec = model_fns.build_model_spec('fedavg_cnn', x_shape=(8, 8, 1),
                                      x_dtype=tf.float32, y_shape=(),
                                      num_classes=10)
    with self.assertRaisesRegex(ValueError, 'too small.*ditto_cnn'):
      spec.build_keras(0)

  def test_unknown_model(self):
    with self.assertRaisesRegex(ValueError, 'Unknown model .*lenet'):
      model_fns.build_model_spec('resnet', x_shape=(8,), x_dtype=tf.float32,
                                 y_shape=(), num_classes=2)

  def test_slimmable_architecture_adds_the_width_input(self):
    kwargs = dict(x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
                  num_classes=10)
    plain = model_fns.build_model_spec('lenet', **kwargs)
    slim = model_fns.build_model_spec('slimmable_lenet', **kwargs)
    self.assertEqual(slim.input_spec['x']['features'], plain.input_spec['x'])
    self.assertEqual(slim.input_spec['x']['width'],
                     tf.TensorSpec([], tf.float32))
    self.assertEqual(slim.input_spec['y'], plain.input_spec['y'])
    # One seed helper: the same seed gives both the same initial weights.
    for a, b in zip(plain.initial_weights(3).trainable,
                    slim.initial_weights(3).trainable):
      self.assertAllEqual(a, b)

  def test_text_model_needs_vocabulary(self):
    with self.assertRaisesRegex(ValueError, 'vocab_size'):
      model_fns.build_model_spec('text_cnn', x_shape=(8,), x_dtype=tf.int32,
                                 y_shape=(), num_classes=2)


class PaddingTest(tf.test.TestCase):
  """Sequence targets: padding carries no loss and counts in no metric."""

  def test_masked_loss_and_accuracy_by_hand(self):
    # Two sequences of 3 targets; label 0 is padding.
    y_true = tf.constant([[2, 1, 0], [1, 0, 0]])
    logits = tf.math.log(tf.constant([
        [[0.1, 0.2, 0.7], [0.3, 0.6, 0.1], [0.9, 0.05, 0.05]],
        [[0.2, 0.1, 0.7], [0.99, 0.005, 0.005], [0.8, 0.1, 0.1]],
    ]))
    loss = model_fns.loss_fn(masks_padding=True)(y_true, logits)
    expected = -(np.log(0.7) + np.log(0.6) + np.log(0.1)) / 3
    self.assertAllClose(loss, expected, rtol=1e-5)
    metric = model_fns.metrics_fn(masks_padding=True)[0]
    metric.update_state(y_true, logits)
    # Right on (0, 0) and (0, 1), wrong on (1, 0); padding ignored (the
    # unmasked metric would count its three 'predicted 0' hits: 5/6).
    self.assertAllClose(metric.result(), 2 / 3)
    unmasked = model_fns.metrics_fn()[0]
    unmasked.update_state(y_true, logits)
    self.assertAllClose(unmasked.result(), 5 / 6)

  def test_all_padding_batch_has_zero_loss(self):
    loss = model_fns.loss_fn(masks_padding=True)(
        tf.zeros([2, 4], tf.int32), tf.random.normal([2, 4, 5]))
    self.assertEqual(float(loss), 0.0)

  def test_char_model_trains_on_unpadded_targets_only(self):
    spec = model_fns.build_model_spec(
        'char_lstm', x_shape=(6,), x_dtype=tf.int32, y_shape=(6,),
        num_classes=90, vocab_size=90)
    self.assertTrue(spec.masks_padding)
    model = spec.model_fn()
    x = tf.constant([[5, 6, 7, 0, 0, 0]])
    padded = model.forward_pass({'x': x, 'y': tf.constant([[6, 7, 8, 0, 0,
                                                            0]])})
    # The mean over the three real targets alone.
    logits = padded.predictions[0, :3]
    expected = tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(
            [6, 7, 8], logits, from_logits=True))
    self.assertAllClose(padded.loss, expected, rtol=1e-5)

  def test_classification_models_do_not_mask(self):
    spec = model_fns.build_model_spec(*_CASES[0][:1], **_CASES[0][1])
    self.assertFalse(spec.masks_padding)


if __name__ == '__main__':
  tf.test.main()
