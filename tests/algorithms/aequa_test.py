"""Aequa's federated slimmable training on real digits."""

import collections

import numpy as np
from sklearn import datasets as sk_datasets
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tff_fair.algorithms import aequa
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import update_attacks
from tff_fair.models import model_fns
from tff_fair.training import rewards

_DIGITS = sk_datasets.load_digits()
_X = (_DIGITS.images / 16.0).astype(np.float32)[..., None]
_Y = _DIGITS.target.astype(np.int32)
_SPEC = model_fns.build_model_spec(
    'slimmable_lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
    num_classes=10)


def _inputs(round_num, clients=4, size=300):
  return [fed_avg.client_input(
      tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          x=_X[i * size:(i + 1) * size],
          y=_Y[i * size:(i + 1) * size])).batch(20),
      update_attacks.no_attack(seed=round_num, client_index=i))
          for i in range(clients)]


def _sgd(lr):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


def _train(process, rounds):
  state = process.set_model_weights(process.initialize(),
                                    _SPEC.initial_weights(0))
  for r in range(rounds):
    state = process.next(state, _inputs(r)).state
  return process.get_model_weights(state)


class WidthDrawsTest(tf.test.TestCase):

  def test_widths_in_range_vary_by_step_and_differ_across_clients(self):
    p_min, p_max, clients, steps = 0.2, 0.9, 12, 12
    round_seed = 1234
    draws = np.array([[
        aequa.sample_widths(tf.constant([round_seed, client], tf.int32),
                            tf.constant(step, tf.int32), p_min, p_max,
                            3).numpy()
        for step in range(steps)] for client in range(clients)])
    self.assertEqual(draws.shape, (clients, steps, 3))
    self.assertTrue(np.all(draws >= p_min))
    self.assertTrue(np.all(draws < p_max))
    # Every (client, step) pair draws its own widths. Seeds [round seed,
    # client] + [0, step] made client i at step k repeat client i + 1 at
    # step k - 1, so most of these 432 values came in duplicate.
    self.assertLen(np.unique(draws), draws.size)
    np.testing.assert_array_equal(
        np.isclose(draws[1:, :-1], draws[:-1, 1:]).all(axis=-1),
        np.zeros((clients - 1, steps - 1), bool))
    # They cover the range, and each client's vary from step to step.
    self.assertLess(draws.min(), p_min + 0.05)
    self.assertGreater(draws.max(), p_max - 0.05)
    self.assertGreater(draws[:, :, 0].std(axis=1).min(), 0.05)
    # Same seed, same widths.
    again = aequa.sample_widths(tf.constant([round_seed, 5], tf.int32),
                                tf.constant(7, tf.int32), p_min, p_max, 3)
    np.testing.assert_array_equal(again.numpy(), draws[5, 7])

  def test_width_and_noise_streams_are_independent(self):
    seed = tf.constant([99, 3], tf.int32)
    streams = (update_attacks.WIDTH_STREAM, update_attacks.NOISE_STREAM)
    seeds = {(stream, index): tuple(
        update_attacks.client_seed(seed, stream, index).numpy().tolist())
             for stream in streams
             for index in range(20)}
    self.assertLen(set(seeds.values()), len(seeds))


def _loop_op_types(widths_per_step, max_width=None):
  """Op types of the sandwich loop's graph and of every function it calls."""
  model = _SPEC.model_fn()
  train = aequa.build_sandwich_loop_fn(0.1, 1.0, widths_per_step)(
      model, _sgd(0.1))
  start = tf.nest.map_structure(
      lambda v: v.numpy(), tff.learning.models.ModelWeights.from_model(model))
  data = tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=_X[:40], y=_Y[:40])).batch(20)
  graph = train.get_concrete_function(
      start, data, tf.constant([1, 2]), max_width).graph
  types = {op.type for op in graph.get_operations()}
  for function in graph._functions.values():  # pylint: disable=protected-access
    types |= {node.op for node in function.definition.node_def}
  return types


class StaticWidthTest(tf.test.TestCase):
  # TFF's Keras wrapper runs the model in a nested tf.function, where a
  # width tensor (even a constant) is a placeholder: every kernel was sliced
  # with dynamic sizes (`active_size`'s Ceil) at full width, +25% a step.

  def test_full_width_pass_has_static_shapes(self):
    self.assertNotIn('Ceil', _loop_op_types(widths_per_step=0))
    self.assertNotIn('Ceil', _loop_op_types(0, max_width=0.5))

  def test_drawn_and_per_client_widths_are_dynamic(self):
    self.assertIn('Ceil', _loop_op_types(widths_per_step=1))
    self.assertIn('Ceil', _loop_op_types(0, max_width=tf.constant(0.5)))


class AequaTest(tff_test_utils.TffTestCase):

  def test_sandwich_training_makes_every_width_useful(self):
    process = aequa.build_aequa(_SPEC.model_fn, _sgd(0.1), _sgd(1.0),
                                p_min=0.25, client_context=True)
    self.assertEqual(
        process.next.type_signature.parameter[1].member.data,
        tff.SequenceType(tff.types.to_type(collections.OrderedDict(
            x=tff.TensorType(np.float32, [None, 8, 8, 1]),
            y=tff.TensorType(np.int32, [None])))))
    weights = _train(process, rounds=12)
    widths = (0.25, 0.5, 1.0)
    curve = rewards.width_accuracy_curve(_SPEC.build_keras, weights, widths,
                                         _X[1200:], _Y[1200:])
    self.assertGreater(curve[0], 0.3)  # Narrowest sub-network, 10 classes.
    self.assertGreater(curve[-1], 0.8)
    self.assertLessEqual(curve[0], curve[-1])

    # Trained at full width only (no sampled widths), narrow sub-networks
    # are much worse: the sandwich term is what trains them.
    full_only = aequa.build_aequa(_SPEC.model_fn, _sgd(0.1), _sgd(1.0),
                                  p_min=0.25, widths_per_step=0,
                                  client_context=True)
    narrow = rewards.width_accuracy_curve(
        _SPEC.build_keras, _train(full_only, rounds=12), (0.25,),
        _X[1200:], _Y[1200:])
    self.assertGreater(curve[0], narrow[0] + 0.1)

  def test_runs_reproduce_from_client_seeds(self):
    process = aequa.build_aequa(_SPEC.model_fn, _sgd(0.1), _sgd(1.0),
                                p_min=0.25, widths_per_step=2,
                                client_context=True)
    a, b = _train(process, rounds=2), _train(process, rounds=2)
    self.assertAllClose(a.trainable, b.trainable)

  def test_bad_widths(self):
    for p_min, p_max, message in ((0.6, 0.5, 'exceeds p_max'),
                                  (0.0, 1.0, r'in \(0, 1\]'),
                                  (0.5, 1.5, r'in \(0, 1\]')):
      with self.assertRaisesRegex(ValueError, message):
        aequa.build_aequa(_SPEC.model_fn, _sgd(0.1), p_min=p_min,
                          p_max=p_max)

  def test_a_model_without_width_input_is_refused_in_one_line(self):
    plain = model_fns.build_model_spec(
        'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
        num_classes=10)
    with self.assertRaisesRegex(
        ValueError, r'^build_aequa needs a slimmable model.*build_model_spec'
        r"\('slimmable_lenet'[^\n]*$"):
      aequa.build_aequa(plain.model_fn, _sgd(0.1))


if __name__ == '__main__':
  tf.test.main()
