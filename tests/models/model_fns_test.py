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
  )
  def test_reference_cnn_shapes(self, name, shapes):
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

  def test_text_model_needs_vocabulary(self):
    with self.assertRaisesRegex(ValueError, 'vocab_size'):
      model_fns.build_model_spec('text_cnn', x_shape=(8,), x_dtype=tf.int32,
                                 y_shape=(), num_classes=2)


if __name__ == '__main__':
  tf.test.main()
