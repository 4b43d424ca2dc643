"""training_loop: training some of the trainable variables, the rest frozen."""

import numpy as np
import tensorflow as tf

from tests.algorithms import digits_clients
from tff_fair.algorithms import training_loop
from tff_fair.models import model_fns

_SPEC = model_fns.build_model_spec(
    'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
    num_classes=10)
_DATA = digits_clients.Clients((40,))
_LR = 0.1


def _by_hand(start, positions, anchor=None, lam=0.0):
  """SGD on the variables at `positions`, eagerly with a GradientTape."""
  model = _SPEC.build_keras(None)
  start.assign_weights_to(model)
  variables = [model.trainable_variables[i] for i in positions]
  loss_fn = model_fns.loss_fn()
  for batch in _DATA.dataset(0):
    with tf.GradientTape() as tape:
      loss = loss_fn(batch['y'], model(batch['x'], training=True))
    gradients = tape.gradient(loss, variables)
    for i, variable, gradient in zip(positions, variables, gradients):
      if anchor is not None:
        gradient += lam * (variable - anchor.trainable[i])
      variable.assign_sub(_LR * gradient)
  return [v.numpy() for v in model.trainable_variables]


class TrainedVariablesTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.start = _SPEC.initial_weights(0)

  def _train(self, positions, **kwargs):
    loop = training_loop.build_training_loop(
        _SPEC.model_fn(), digits_clients.sgd(_LR),
        average_iterates=kwargs.pop('average_iterates', False),
        trained_variables=positions)
    return [w.numpy()
            for w in loop(self.start, _DATA.dataset(0), **kwargs)[
                'weights'].trainable]

  def test_only_the_chosen_variables_move_as_sgd_on_them_alone(self):
    count = len(self.start.trainable)
    for positions in ([count - 2, count - 1], list(range(count - 2)), [3]):
      with self.subTest(positions=positions):
        trained = self._train(positions)
        for i, (before, after, expected) in enumerate(zip(
            self.start.trainable, trained, _by_hand(self.start, positions))):
          if i in positions:
            self.assertAllClose(after, expected, atol=1e-6)
            self.assertNotAllClose(after, before)
          else:  # Frozen: exactly the start value.
            np.testing.assert_array_equal(after, before)

  def test_proximal_term_and_averaged_iterates_on_chosen_variables(self):
    head = [8, 9]
    anchor = _SPEC.initial_weights(1)
    trained = self._train(head, anchor=anchor, lam=0.5)
    for i, expected in zip(head, [
        _by_hand(self.start, head, anchor, 0.5)[i] for i in head]):
      self.assertAllClose(trained[i], expected, atol=1e-6)
    averaged = self._train(head, average_iterates=True)
    last = self._train(head)
    for i, before in enumerate(self.start.trainable):
      if i in head:  # The mean of the iterates, not the last one.
        self.assertNotAllClose(averaged[i], last[i])
      else:
        np.testing.assert_array_equal(averaged[i], before)

  def test_bad_positions_are_refused(self):
    for positions in ([], [10], [-1], [2, 2]):
      with self.subTest(positions=positions), self.assertRaisesRegex(
          ValueError, 'trained_variables must be distinct positions in'
          r' \[0, 10\)'):
        training_loop.build_training_loop(
            _SPEC.model_fn(), digits_clients.sgd(),
            trained_variables=positions)


class StepsOnBatchTest(tf.test.TestCase):

  def test_equals_the_loop_on_the_batch_repeated(self):
    batch = next(iter(_DATA.dataset(0)))
    start, anchor = _SPEC.initial_weights(0), _SPEC.initial_weights(1)
    on_batch = training_loop.build_steps_on_batch(
        _SPEC.model_fn(), digits_clients.sgd(_LR))(
            start, batch, 5, anchor=anchor, lam=0.5)
    looped = training_loop.build_training_loop(
        _SPEC.model_fn(), digits_clients.sgd(_LR))(
            start, tf.data.Dataset.from_tensors(batch).repeat(5),
            anchor=anchor, lam=0.5)
    self.assertAllClose(on_batch['weights'].trainable,
                        looped['weights'].trainable, atol=1e-6)
    self.assertNotAllClose(on_batch['weights'].trainable, start.trainable)
    self.assertAllClose(on_batch['loss'], looped['loss'])
    self.assertEqual(int(on_batch['num_examples']),
                     5 * int(tf.shape(batch['y'])[0]))


if __name__ == '__main__':
  tf.test.main()
