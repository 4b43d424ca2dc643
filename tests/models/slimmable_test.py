"""Slimmable layers: equal to sliced Keras layers, zero gradients, one trace."""

import collections

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tff_fair.models import slimmable

# p_min = 0.1 is the smallest width the Aequa paper uses.
_WIDTHS = (1.0, 0.75, 0.5, 0.3, 0.25, 0.1)
_TOL = dict(rtol=1e-6, atol=1e-6)


def _rng(seed=0):
  return np.random.default_rng(seed)


def _randomize(layer, seed=0):
  """Random values for every weight (biases and GN offsets not zero)."""
  rng = _rng(seed)
  for v in layer.weights:
    v.assign(rng.normal(size=v.shape).astype(np.float32))


def _run(layer, x, width, graph):
  """The layer at `width`: eagerly (static sizes) or in a graph (dynamic)."""
  if not graph:
    return layer(x, width=width)
  fn = tf.function(lambda x, w: layer(x, width=w))
  return fn(x, tf.constant(width, tf.float32))


def _active(width, full):
  return slimmable.active_size_py(width, full)


def _tiny_image_model():
  return slimmable.SlimmableSequential(
      [
          slimmable.SlimmableConv2D(8, 3, slim_input=False),
          slimmable.SlimmableGroupNormalization(groups=4),
          tf.keras.layers.ReLU(),
          slimmable.SlimmableConv2D(8, 3, padding='same', activation='relu'),
          tf.keras.layers.MaxPool2D(2),
          slimmable.SlimmableDense(6, activation='relu', flatten_input=True),
          slimmable.SlimmableDense(3, slim_output=False),
      ],
      feature_shape=(8, 8, 2),
  ).build_at_full_width()


def _tiny_text_model():
  return slimmable.SlimmableSequential(
      [
          slimmable.SlimmableEmbedding(30, 8),
          slimmable.SlimmableConv1D(6, 3, padding='same', activation='relu'),
          tf.keras.layers.GlobalMaxPool1D(),
          slimmable.SlimmableDense(2, slim_output=False),
      ],
      feature_shape=(7,),
      feature_dtype=tf.int32,
  ).build_at_full_width()


def _image_batch(n=4):
  return tf.constant(_rng(1).normal(size=(n, 8, 8, 2)).astype(np.float32))


def _text_batch(n=4):
  return tf.constant(_rng(2).integers(0, 30, size=(n, 7)), tf.int32)


class ActiveSizeTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(
      (0.5, 64, 32), (0.25, 64, 16), (0.3, 10, 3), (0.7, 10, 7),
      (0.1, 6, 1), (0.01, 6, 1), (1.0, 6, 6), (0.26, 100, 26),
      (0.125, 512, 64), (1 / 3, 3, 1), (0.2, 5, 1), (0.31, 10, 4),
      (0.9, 1, 1),
  )
  def test_known_values(self, width, full, expected):
    self.assertEqual(slimmable.active_size_py(width, full), expected)
    self.assertEqual(slimmable.active_size(tf.constant(width), full), expected)

  def test_graph_width_matches_python(self):
    widths = np.concatenate(
        [np.linspace(0.01, 1.0, 397), np.arange(1, 101) / 100]
    ).astype(np.float32)
    fulls = (1, 3, 6, 10, 16, 64, 120, 512)
    fn = tf.function(
        lambda w: tf.stack([slimmable.active_size(w, c) for c in fulls]),
        input_signature=[tf.TensorSpec([], tf.float32)],
    )
    for w in widths:
      expected = [slimmable.active_size_py(float(w), c) for c in fulls]
      self.assertAllEqual(fn(w), expected, msg=f'width {w}')
      for c, n in zip(fulls, expected):
        self.assertBetween(n, 1, c)
        self.assertGreaterEqual(n, float(w) * c - 1e-4)


class LayerEquivalenceTest(tf.test.TestCase, parameterized.TestCase):
  """At width p a slimmable layer IS the Keras layer with sliced weights."""

  @parameterized.product(
      width=_WIDTHS, slim_input=(True, False), slim_output=(True, False),
      graph=(False, True),
  )
  def test_dense(self, width, slim_input, slim_output, graph):
    x = tf.constant(_rng(3).normal(size=(5, 12)).astype(np.float32))
    layer = slimmable.SlimmableDense(
        10, activation='relu', slim_input=slim_input, slim_output=slim_output
    )
    layer(x)
    _randomize(layer)
    ci = _active(width, 12) if slim_input else 12
    co = _active(width, 10) if slim_output else 10
    reference = tf.keras.layers.Dense(co, activation='relu')
    reference.build([None, ci])
    reference.set_weights(
        [layer.kernel.numpy()[:ci, :co], layer.bias.numpy()[:co]]
    )
    got = _run(layer, x[:, :ci], width, graph)
    self.assertEqual(got.shape, (5, co))
    self.assertAllClose(got, reference(x[:, :ci]), **_TOL)

  @parameterized.product(width=_WIDTHS, graph=(False, True))
  def test_dense_flatten_input(self, width, graph):
    x = tf.constant(_rng(4).normal(size=(5, 3, 2, 8)).astype(np.float32))
    layer = slimmable.SlimmableDense(7, flatten_input=True)
    layer(x)
    _randomize(layer)
    ci, co = _active(width, 8), _active(width, 7)
    kernel = layer.kernel.numpy().reshape(6, 8, 7)[:, :ci, :co]
    reference = tf.keras.Sequential([
        tf.keras.layers.Flatten(input_shape=(3, 2, ci)),
        tf.keras.layers.Dense(co),
    ])
    reference.set_weights([kernel.reshape(6 * ci, co), layer.bias[:co]])
    got = _run(layer, x[..., :ci], width, graph)
    self.assertAllClose(got, reference(x[..., :ci]), **_TOL)

  @parameterized.product(
      width=_WIDTHS, padding=('same', 'valid'), graph=(False, True)
  )
  def test_conv2d(self, width, padding, graph):
    x = tf.constant(_rng(5).normal(size=(2, 9, 9, 6)).astype(np.float32))
    layer = slimmable.SlimmableConv2D(
        8, 3, strides=2, padding=padding, activation='relu'
    )
    layer(x)
    _randomize(layer)
    ci, co = _active(width, 6), _active(width, 8)
    reference = tf.keras.layers.Conv2D(
        co, 3, strides=2, padding=padding, activation='relu'
    )
    reference.build([None, 9, 9, ci])
    reference.set_weights(
        [layer.kernel.numpy()[..., :ci, :co], layer.bias.numpy()[:co]]
    )
    got = _run(layer, x[..., :ci], width, graph)
    self.assertAllClose(got, reference(x[..., :ci]), **_TOL)

  @parameterized.product(
      width=_WIDTHS,
      options=(
          dict(padding='same'),
          dict(padding='valid', dilation_rate=2, use_bias=False),
      ),
      graph=(False, True),
  )
  def test_conv1d(self, width, options, graph):
    x = tf.constant(_rng(6).normal(size=(2, 11, 6)).astype(np.float32))
    layer = slimmable.SlimmableConv1D(8, 4, **options)
    layer(x)
    _randomize(layer)
    ci, co = _active(width, 6), _active(width, 8)
    reference = tf.keras.layers.Conv1D(co, 4, **options)
    reference.build([None, 11, ci])
    weights = [layer.kernel.numpy()[..., :ci, :co]]
    if layer.use_bias:
      weights.append(layer.bias.numpy()[:co])
    reference.set_weights(weights)
    got = _run(layer, x[..., :ci], width, graph)
    self.assertAllClose(got, reference(x[..., :ci]), **_TOL)

  @parameterized.product(width=_WIDTHS, graph=(False, True))
  def test_embedding(self, width, graph):
    ids = tf.constant(_rng(7).integers(0, 20, size=(3, 7)), tf.int32)
    layer = slimmable.SlimmableEmbedding(20, 16)
    layer(ids)
    _randomize(layer)
    co = _active(width, 16)
    reference = tf.keras.layers.Embedding(20, co)
    reference.build([None, 7])
    reference.set_weights([layer.embeddings.numpy()[:, :co]])
    got = _run(layer, ids, width, graph)
    self.assertEqual(got.shape, (3, 7, co))
    self.assertAllClose(got, reference(ids), **_TOL)

  @parameterized.product(
      # Active channels 16, 12, 8, 4: whole groups of 4.
      width=(1.0, 0.75, 0.5, 0.25),
      shape=((2, 5, 5, 16), (2, 6, 16), (3, 16)),
      graph=(False, True),
  )
  def test_group_norm_whole_groups(self, width, shape, graph):
    x = tf.constant(_rng(8).normal(2.0, 3.0, size=shape).astype(np.float32))
    layer = slimmable.SlimmableGroupNormalization(groups=4)
    layer(x)
    _randomize(layer)
    ca = _active(width, 16)
    reference = tf.keras.layers.GroupNormalization(groups=ca // 4)
    reference.build([None, *shape[1:-1], ca])
    reference.set_weights([layer.gamma.numpy()[:ca], layer.beta.numpy()[:ca]])
    got = _run(layer, x[..., :ca], width, graph)
    self.assertAllClose(got, reference(x[..., :ca]), **_TOL)

  @parameterized.product(
      # Active channels 5 and 2: groups [0-3, 4] and [0-1] (a partial group).
      width=(0.3, 0.1), graph=(False, True),
  )
  def test_group_norm_partial_group(self, width, graph):
    x = tf.constant(_rng(9).normal(size=(2, 4, 4, 16)).astype(np.float32))
    layer = slimmable.SlimmableGroupNormalization(group_size=4)
    layer(x)
    _randomize(layer)
    ca = _active(width, 16)
    gamma, beta = layer.gamma.numpy(), layer.beta.numpy()
    parts = []
    for start in range(0, ca, 4):
      stop = min(start + 4, ca)
      group = tf.keras.layers.GroupNormalization(groups=1)
      group.build([None, 4, 4, stop - start])
      group.set_weights([gamma[start:stop], beta[start:stop]])
      parts.append(group(x[..., start:stop]))
    got = _run(layer, x[..., :ca], width, graph)
    self.assertEqual(got.shape[-1], ca)
    self.assertAllClose(got, tf.concat(parts, axis=-1), **_TOL)


class GradientTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('image', _tiny_image_model, _image_batch, 3),
      ('text', _tiny_text_model, _text_batch, 2),
  )
  def test_no_gradient_beyond_width(self, build, batch, classes):
    model = build()
    rng = _rng(10)
    for v in model.trainable_variables:  # Positive offsets: no dead ReLUs.
      if 'bias' in v.name or 'beta' in v.name:
        v.assign(rng.uniform(0.2, 0.6, size=v.shape).astype(np.float32))
    features = batch()
    labels = tf.constant(np.arange(features.shape[0]) % classes)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
      loss = loss_fn(labels, model(slimmable.slimmable_inputs(features, 0.5)))
    grads = tape.gradient(loss, model.trainable_variables)
    masks = slimmable.variable_masks(model, 0.5)
    graph_masks = tf.function(lambda w: slimmable.variable_masks(model, w))(
        tf.constant(0.5)
    )
    unused = 0
    for v, g, mask, graph_mask in zip(
        model.trainable_variables, grads, masks, graph_masks
    ):
      g = tf.convert_to_tensor(g).numpy()
      mask = mask.numpy()
      self.assertAllEqual(mask, graph_mask)
      unused += int((mask == 0).sum())
      # Exactly zero beyond the width, and used within it.
      self.assertAllEqual(g[mask == 0], np.zeros(int((mask == 0).sum())),
                          msg=v.name)
      self.assertTrue(np.any(g[mask == 1] != 0), msg=v.name)
    # Only the logits' bias (outputs = classes) is fully used at width 0.5.
    self.assertGreater(unused, 0)
    self.assertEqual(
        [v.name for v, m in zip(model.trainable_variables, masks)
         if np.all(m.numpy() == 1)],
        [model.trainable_variables[-1].name],
    )


class TracingTest(tf.test.TestCase, parameterized.TestCase):

  def test_one_trace_serves_every_width(self):
    model = _tiny_image_model()
    x = _image_batch()
    fn = tf.function(lambda x, w: model(slimmable.slimmable_inputs(x, w)))
    for width in _WIDTHS:
      got = fn(x, tf.constant(width))
      self.assertEqual(got.shape, (4, 3))
      self.assertAllClose(
          got, model(slimmable.slimmable_inputs(x, width)), **_TOL
      )
    self.assertEqual(fn.experimental_get_tracing_count(), 1)

  def test_graph_width_keeps_static_rank(self):
    model = _tiny_image_model()
    conv = slimmable.slimmable_layers(model)[0]
    spec = [tf.TensorSpec([None, 8, 8, 2]), tf.TensorSpec([], tf.float32)]
    hidden = tf.function(lambda x, w: conv(x, width=w)).get_concrete_function(
        *spec
    )
    self.assertEqual(hidden.structured_outputs.shape.as_list(),
                     [None, 6, 6, None])
    logits = tf.function(
        lambda x, w: model(slimmable.slimmable_inputs(x, w))
    ).get_concrete_function(*spec)
    self.assertEqual(logits.structured_outputs.shape.as_list(), [None, 3])

  @parameterized.named_parameters(
      ('image', _tiny_image_model, _image_batch, 3),
      ('text', _tiny_text_model, _text_batch, 2),
  )
  def test_graph_width_gradient_is_a_pad(self, build, batch, classes):
    # The slices are tf.slice, whose gradient is one Pad, not strided
    # slices, whose gradient (StridedSliceGrad) is slower.
    model = build()
    features = batch()
    labels = tf.constant(np.arange(features.shape[0]) % classes)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def gradients(width):
      with tf.GradientTape() as tape:
        loss = loss_fn(labels,
                       model(slimmable.slimmable_inputs(features, width)))
      return tape.gradient(loss, model.trainable_variables)

    graph_gradients = tf.function(gradients)
    concrete = graph_gradients.get_concrete_function(
        tf.TensorSpec([], tf.float32))
    op_types = {op.type for op in concrete.graph.get_operations()}
    for function in concrete.graph._functions.values():  # pylint: disable=protected-access
      op_types |= {node.op for node in function.definition.node_def}
    self.assertNotIn('StridedSliceGrad', op_types)
    self.assertIn('Pad', op_types)
    for got, want in zip(graph_gradients(tf.constant(0.5)), gradients(0.5)):
      self.assertAllClose(tf.convert_to_tensor(got),
                          tf.convert_to_tensor(want), **_TOL)

  def test_training_step_at_several_widths(self):
    model = _tiny_image_model()
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _image_batch(), tf.constant([0, 1, 2, 0])

    @tf.function
    def step(width):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(slimmable.slimmable_inputs(x, width)))
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss

    for width in (0.25, 1.0, 0.5, 0.25):
      before = [v.numpy() for v in model.trainable_variables]
      self.assertTrue(np.isfinite(step(tf.constant(width)).numpy()))
      for v, old, mask in zip(
          model.trainable_variables, before,
          slimmable.variable_masks(model, width),
      ):
        unused = mask.numpy() == 0
        self.assertAllEqual(v.numpy()[unused], old[unused])
    self.assertEqual(step.experimental_get_tracing_count(), 1)


class ComputeTest(tf.test.TestCase):

  def test_narrow_width_slices_kernels(self):
    model = _tiny_image_model()
    conv1, norm, conv2, dense1, dense2 = slimmable.slimmable_layers(model)
    x = _image_batch()
    model(slimmable.slimmable_inputs(x, 0.25))
    self.assertEqual(conv1.last_active['kernel_shape'], (3, 3, 2, 2))
    self.assertEqual(norm.last_active['kernel_shape'], (2,))
    self.assertEqual(conv2.last_active['kernel_shape'], (3, 3, 2, 2))
    self.assertEqual(dense1.last_active['kernel_shape'], (9 * 2, 2))
    self.assertEqual(dense2.last_active['kernel_shape'], (2, 3))
    self.assertEqual(conv2.last_active['macs'], 6 * 6 * 9 * 2 * 2)
    model(slimmable.slimmable_inputs(x, 1.0))
    self.assertEqual(conv1.last_active['kernel_shape'], (3, 3, 2, 8))
    self.assertEqual(conv2.last_active['kernel_shape'], (3, 3, 8, 8))
    self.assertEqual(dense1.last_active['kernel_shape'], (9 * 8, 6))
    self.assertEqual(dense2.last_active['kernel_shape'], (6, 3))
    self.assertEqual(conv2.last_active['macs'], 6 * 6 * 9 * 8 * 8)

  def test_active_parameter_counts(self):
    model = _tiny_image_model()
    full = (3 * 3 * 2 * 8 + 8) + 2 * 8 + (3 * 3 * 8 * 8 + 8) + (
        9 * 8 * 6 + 6) + (6 * 3 + 3)
    quarter = (3 * 3 * 2 * 2 + 2) + 2 * 2 + (3 * 3 * 2 * 2 + 2) + (
        9 * 2 * 2 + 2) + (2 * 3 + 3)
    self.assertEqual(model.count_params(), full)
    self.assertEqual(slimmable.active_parameter_count(model, 1.0), full)
    self.assertEqual(slimmable.active_parameter_count(model, 0.25), quarter)
    for width in (0.25, 1.0):
      masks = slimmable.variable_masks(model, width)
      self.assertEqual(
          sum(int(m.numpy().sum()) for m in masks),
          slimmable.active_parameter_count(model, width),
      )
    self.assertLess(
        slimmable.multiply_accumulates(model, 0.25),
        0.2 * slimmable.multiply_accumulates(model, 1.0),
    )


class BadInputTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(0.0, -0.5, 1.01, 2.0, float('nan'))
  def test_bad_width_eager(self, width):
    model = _tiny_image_model()
    with self.assertRaisesRegex(ValueError, r'width must be in \(0, 1\]'):
      model(slimmable.slimmable_inputs(_image_batch(), width))
    layer = slimmable.SlimmableDense(4)
    with self.assertRaisesRegex(ValueError, r'width must be in \(0, 1\]'):
      layer(tf.ones([2, 3]), width=width)

  @parameterized.parameters(0.0, -0.5, 1.01, float('nan'))
  def test_bad_width_graph(self, width):
    model = _tiny_image_model()
    fn = tf.function(lambda x, w: model(slimmable.slimmable_inputs(x, w)))
    with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError, r'width must be in \(0, 1\]'
    ):
      fn(_image_batch(), tf.constant(width))
    layer = slimmable.SlimmableDense(4)
    layer(tf.ones([2, 3]))
    layer_fn = tf.function(lambda x, w: layer(x, width=w))
    with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError, r'width must be in \(0, 1\]'
    ):
      layer_fn(tf.ones([2, 3]), tf.constant(width))

  def test_per_example_width(self):
    model = _tiny_image_model()
    x = _image_batch()
    same = model(slimmable.slimmable_inputs(x, tf.fill([4], 0.5)))
    self.assertAllClose(same, model(slimmable.slimmable_inputs(x, 0.5)))
    with self.assertRaisesRegex(ValueError, 'one width'):
      model(slimmable.slimmable_inputs(x, tf.constant([0.5, 0.5, 1.0, 1.0])))
    fn = tf.function(lambda x, w: model(slimmable.slimmable_inputs(x, w)))
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'one width'):
      fn(x, tf.constant([0.5, 0.5, 1.0, 1.0]))

  def test_layer_must_be_built_at_full_width(self):
    layer = slimmable.SlimmableDense(4)
    fn = tf.function(
        lambda x: layer(x, width=0.5),
        input_signature=[tf.TensorSpec([None, None], tf.float32)],
    )
    with self.assertRaisesRegex(ValueError, 'width 1.0 first'):
      fn(tf.ones([2, 6]))

  def test_wrong_input_channels(self):
    layer = slimmable.SlimmableDense(4)
    layer(tf.ones([2, 12]))
    with self.assertRaisesRegex(ValueError, 'expects 6 input channels'):
      layer(tf.ones([2, 12]), width=0.5)  # Should be slim_input=False.

  def test_bad_layer_arguments(self):
    with self.assertRaisesRegex(ValueError, 'must divide'):
      slimmable.SlimmableGroupNormalization(groups=3)(tf.ones([2, 8]))
    with self.assertRaisesRegex(ValueError, 'exactly one'):
      slimmable.SlimmableGroupNormalization()
    with self.assertRaisesRegex(ValueError, 'padding'):
      slimmable.SlimmableConv1D(4, 3, padding='causal')


class InputContractTest(tf.test.TestCase):

  def test_input_forms(self):
    model = _tiny_image_model()
    x = _image_batch()
    full = model(slimmable.slimmable_inputs(x, 1.0))
    self.assertAllClose(model(x), full, **_TOL)  # Bare features: full width.
    self.assertAllClose(model((x, 1.0)), full, **_TOL)
    self.assertAllClose(
        model({'features': x, 'width': 0.5}),
        model(slimmable.slimmable_inputs(x, 0.5)),
        **_TOL,
    )
    self.assertNotAllClose(model(slimmable.slimmable_inputs(x, 0.5)), full)
    with self.assertRaisesRegex(KeyError, 'features'):
      model({'x': x, 'width': 0.5})

  def test_with_width_data_set(self):
    dataset = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(
            x=np.zeros((5, 8, 8, 2), np.float32), y=np.zeros(5, np.int32)
        )
    ).batch(2)
    spec = slimmable.input_spec_with_width(dataset.element_spec)
    widened = dataset.map(lambda e: slimmable.with_width(e, 0.25))
    self.assertEqual(widened.element_spec, spec)
    self.assertEqual(
        spec['x']['width'], tf.TensorSpec([], tf.float32)
    )
    model = _tiny_image_model()
    for batch in widened:
      # tff.learning counts examples from the first flattened tensor of x.
      self.assertEqual(tf.nest.flatten(batch['x'])[0].shape[1:], (8, 8, 2))
      self.assertEqual(model(batch['x']).shape, (batch['y'].shape[0], 3))
    self.assertEqual(
        model.input_spec_with_width(),
        collections.OrderedDict(
            features=tf.TensorSpec([None, 8, 8, 2], tf.float32),
            width=tf.TensorSpec([], tf.float32),
        ),
    )


if __name__ == '__main__':
  tf.test.main()
