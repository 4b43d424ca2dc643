"""Slimmable architectures: sizes, nested sub-networks, one TFF round."""

import collections

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tff_fair.models import architectures
from tff_fair.models import model_fns
from tff_fair.models import slimmable
from tff_fair.models import slimmable_models

P_MIN = 0.1  # The smallest width in the Aequa paper.


def _resnet18_parameters(num_classes: int) -> int:
  """CIFAR ResNet-18 (norm layers: 2 parameters per channel)."""
  total = 3 * 3 * 3 * 64 + 2 * 64  # Stem.
  in_planes = 64
  for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
    for index in range(2):
      total += 3 * 3 * in_planes * planes + 3 * 3 * planes * planes
      total += 2 * (2 * planes)
      if index == 0 and (stride != 1 or in_planes != planes):
        total += in_planes * planes + 2 * planes
      in_planes = planes
  return total + 512 * num_classes + num_classes


# (builder, reference builder or None, feature shape, dtype, classes, params)
_CASES = collections.OrderedDict(
    lenet28=(
        lambda s: slimmable_models.lenet(seed=s),
        lambda s: architectures.lenet(seed=s),
        (28, 28, 1), tf.float32, 10, 107_786,
    ),
    lenet8=(
        lambda s: slimmable_models.lenet((8, 8, 1), seed=s),
        lambda s: architectures.lenet((8, 8, 1), seed=s),
        (8, 8, 1), tf.float32, 10, 21_386,
    ),
    cifar_cnn=(
        lambda s: slimmable_models.cifar_cnn(seed=s),
        lambda s: architectures.cifar_cnn(seed=s),
        (32, 32, 3), tf.float32, 10, 122_570,
    ),
    fedavg_cnn=(
        lambda s: slimmable_models.two_conv_cnn(
            seed=s, hidden_units=512, padding='valid'),
        lambda s: architectures.two_conv_cnn(
            seed=s, hidden_units=512, padding='valid'),
        (28, 28, 1), tf.float32, 10, 582_026,
    ),
    text_cnn=(
        lambda s: slimmable_models.text_cnn(20, 100, seed=s),
        lambda s: architectures.text_cnn(20, 100, seed=s),
        (20,), tf.int32, 2, 56_130,
    ),
    resnet18=(
        lambda s: slimmable_models.resnet18(seed=s),
        None,
        (32, 32, 3), tf.float32, 10, 11_173_962,
    ),
)


def _features(shape, dtype, n=3, seed=0):
  rng = np.random.default_rng(seed)
  if dtype == tf.int32:
    return tf.constant(rng.integers(0, 100, size=(n, *shape)), tf.int32)
  return tf.constant(rng.random((n, *shape)).astype(np.float32))


class SlimmableModelsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*[(k, *v) for k, v in _CASES.items()])
  def test_logits_and_sizes(self, build, build_reference, shape, dtype,
                            classes, params):
    model = build(0)
    self.assertEqual(model.count_params(), params)
    if build_reference is not None:
      self.assertEqual(build_reference(0).count_params(), params)
    x = _features(shape, dtype)
    for width in (P_MIN, 0.25, 1.0):
      logits = model(slimmable.slimmable_inputs(x, width))
      self.assertEqual(logits.shape, (3, classes))
      self.assertTrue(np.all(np.isfinite(logits.numpy())))
    self.assertEqual(slimmable.active_parameter_count(model, 1.0), params)
    counts = [
        slimmable.active_parameter_count(model, w)
        for w in (P_MIN, 0.25, 0.5, 0.75, 1.0)
    ]
    self.assertEqual(counts, sorted(set(counts)))  # Strictly increasing.
    self.assertLess(counts[1], 0.15 * params)
    self.assertEqual(model.feature_spec.shape[1:], shape)

  @parameterized.named_parameters(
      *[(k, *v[:4]) for k, v in _CASES.items() if v[1] is not None]
  )
  def test_full_width_is_the_reference_model(self, build, build_reference,
                                             shape, dtype):
    reference = build_reference(5)
    model = build(7)
    self.assertEqual(
        [v.shape for v in model.trainable_variables],
        [v.shape for v in reference.trainable_variables],
    )
    model.set_weights(reference.get_weights())
    x = _features(shape, dtype, seed=1)
    self.assertAllClose(model(x), reference(x), rtol=1e-6, atol=1e-6)
    self.assertAllClose(
        model(slimmable.slimmable_inputs(x, 1.0)), reference(x),
        rtol=1e-6, atol=1e-6,
    )

  @parameterized.parameters(0.25, 0.5, P_MIN)
  def test_narrow_lenet_is_a_small_lenet(self, width):
    """Width p = an ordinary LeNet with ceil(p * C) channels, sliced weights."""
    model = slimmable_models.lenet(seed=3)
    for v in model.trainable_variables:
      v.assign(np.random.default_rng(4).normal(0, 0.2, v.shape))
    c1, c2, f1, f2 = (slimmable.active_size_py(width, c)
                      for c in (6, 16, 120, 84))
    small = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(c1, 5, padding='same', activation='relu'),
        tf.keras.layers.MaxPool2D(2, padding='same'),
        tf.keras.layers.Conv2D(c2, 5, padding='same', activation='relu'),
        tf.keras.layers.MaxPool2D(2, padding='same'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(f1, activation='relu'),
        tf.keras.layers.Dense(f2, activation='relu'),
        tf.keras.layers.Dense(10),
    ])
    k1, b1, k2, b2, k3, b3, k4, b4, k5, b5 = model.get_weights()
    small.set_weights([
        k1[..., :c1], b1[:c1],
        k2[..., :c1, :c2], b2[:c2],
        k3.reshape(49, 16, 120)[:, :c2, :f1].reshape(49 * c2, f1), b3[:f1],
        k4[:f1, :f2], b4[:f2],
        k5[:f2], b5,
    ])
    x = _features((28, 28, 1), tf.float32, n=4, seed=2)
    self.assertAllClose(
        model(slimmable.slimmable_inputs(x, width)), small(x),
        rtol=1e-5, atol=1e-5,
    )
    self.assertEqual(
        slimmable.active_parameter_count(model, width), small.count_params()
    )

  def test_group_norm_variants(self):
    # Convolutions lose their bias (C) and GroupNorm adds gamma, beta (2 C).
    for build, reference, channels in (
        (lambda: slimmable_models.lenet(norm_groups=2), architectures.lenet,
         6 + 16),
        (lambda: slimmable_models.cifar_cnn(norm_groups=8),
         architectures.cifar_cnn, 32 + 64 + 64),
    ):
      model = build()
      self.assertEqual(model.count_params(),
                       reference().count_params() + channels)
      x = _features(model.feature_spec.shape[1:], tf.float32)
      for width in (P_MIN, 1.0):
        self.assertEqual(
            model(slimmable.slimmable_inputs(x, width)).shape, (3, 10)
        )

  def test_resnet_parameter_formula(self):
    self.assertEqual(_resnet18_parameters(10), 11_173_962)
    self.assertEqual(
        slimmable_models.resnet18(num_classes=100).count_params(),
        _resnet18_parameters(100),
    )

  def test_seeded(self):
    a, b, c = (slimmable_models.cifar_cnn(seed=s) for s in (1, 1, 2))
    for x, y in zip(a.get_weights(), b.get_weights()):
      self.assertAllEqual(x, y)
    self.assertNotAllClose(a.get_weights()[0], c.get_weights()[0])

  def test_compute_shrinks(self):
    model = slimmable_models.cifar_cnn()
    narrow = slimmable.multiply_accumulates(model, 0.25)
    full = slimmable.multiply_accumulates(model, 1.0)
    self.assertEqual(full, 30 * 30 * 27 * 32 + 13 * 13 * 288 * 64
                     + 4 * 4 * 576 * 64 + 1024 * 64 + 64 * 10)
    self.assertLess(narrow, 0.1 * full)

  def test_model_spec(self):
    spec = model_fns.build_model_spec(
        'slimmable_text_cnn', x_shape=(20,), x_dtype=tf.int32, y_shape=(),
        num_classes=2, vocab_size=100,
    )
    self.assertEqual(
        spec.input_spec,
        collections.OrderedDict(
            x=collections.OrderedDict(
                features=tf.TensorSpec([None, 20], tf.int32),
                width=tf.TensorSpec([], tf.float32),
            ),
            y=tf.TensorSpec([None], tf.int32),
        ),
    )
    weights = spec.initial_weights(3)
    self.assertLen(weights.trainable, 9)  # Embedding, 3 x conv, logits.
    with self.assertRaisesRegex(ValueError,
                                "Unknown model 'slimmable_char_lstm'"):
      model_fns.build_model_spec(
          'slimmable_char_lstm', x_shape=(8, 8, 1), x_dtype=tf.float32,
          y_shape=(), num_classes=10,
      )
    with self.assertRaisesRegex(ValueError, 'vocab_size'):
      model_fns.build_model_spec(
          'slimmable_text_cnn', x_shape=(20,), x_dtype=tf.int32, y_shape=(),
          num_classes=2,
      )


class SlimmableFedAvgTest(tff_test_utils.TffTestCase):
  """The width contract inside tff.learning: one process, clients' widths."""

  def test_fed_avg_round_at_two_widths(self):
    spec = model_fns.build_model_spec(
        'slimmable_lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
        num_classes=10,
    )
    process = tff.learning.algorithms.build_weighted_fed_avg(
        spec.model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
    )
    rng = np.random.default_rng(0)

    def client(width, n=12):
      data = collections.OrderedDict(
          x=rng.random((n, 8, 8, 1)).astype(np.float32),
          y=rng.integers(0, 10, n).astype(np.int32),
      )
      return tf.data.Dataset.from_tensor_slices(data).batch(4).map(
          lambda e: slimmable.with_width(e, width)
      )

    narrow, full = client(0.25), client(1.0)
    state = process.initialize()
    start = process.get_model_weights(state).trainable
    # Round 1: only the narrow client: coordinates beyond 0.25 stay put.
    output = process.next(state, [narrow])
    after = process.get_model_weights(output.state).trainable
    masks = slimmable.variable_masks(spec.build_keras(0), 0.25)
    for old, new, mask in zip(start, after, masks):
      mask = mask.numpy()
      self.assertAllEqual(new[mask == 0], old[mask == 0])
      self.assertTrue(np.any(new[mask == 1] != old[mask == 1]))
    # Round 2: both widths in one round.
    output = process.next(output.state, [narrow, full])
    train = output.metrics['client_work']['train']
    self.assertEqual(train['num_examples'], 24)
    self.assertTrue(np.isfinite(train['loss']))
    final = process.get_model_weights(output.state).trainable
    changed_beyond_narrow = sum(
        int(np.sum(new[m.numpy() == 0] != old[m.numpy() == 0]))
        for old, new, m in zip(after, final, masks)
    )
    self.assertGreater(changed_beyond_narrow, 0)


if __name__ == '__main__':
  tf.test.main()
