"""Training-time Aequa on real digits: masked aggregation, widths, bytes."""


import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tests.algorithms import digits_clients
from tff_fair import attacks
from tff_fair.algorithms import aequa
from tff_fair.algorithms import aequa_rewards
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import update_attacks
from tff_fair.fairness import contribution
from tff_fair.models import model_fns
from tff_fair.models import slimmable

_SPEC = model_fns.build_model_spec(
    'slimmable_lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
    num_classes=10)
_P_MIN = 0.25
# Clients of different sizes (so weights differ) and widths: nobody trains
# beyond 0.5, two clients train (0.25, 0.5], all three train <= 0.25.
_SIZES = (60, 100, 140)
_WIDTHS = (0.25, 0.5, 0.5)


_dataset = digits_clients.Clients(_SIZES).dataset
_sgd = digits_clients.sgd


def _keras():
  return _SPEC.build_keras(None)


def _build(**kwargs):
  return aequa_rewards.build_aequa_rewards(
      _SPEC.model_fn, _sgd(0.1), _sgd(1.0), keras_model_fn=_keras,
      p_min=_P_MIN, **kwargs)


def _input(client, width, round_seed=0, attack=attacks.NONE, scale=1.0):
  spec = update_attacks.attack_spec(attack, scale, seed=round_seed,
                                    client_index=client)
  return aequa_rewards.client_input(_dataset(client), width, spec)


def _masks(width):
  return [m.numpy() for m in slimmable.variable_masks(_keras(), width)]


class SandwichWidthsTest(tf.test.TestCase):
  """The local loop with a client's maximum width p_i."""

  def test_drawn_widths_never_exceed_the_client_s_width(self):
    for p_i in (0.25, 0.4, 0.7, 1.0):
      draws = np.array([
          aequa.sample_widths(tf.constant([7, c], tf.int32),
                              tf.constant(step, tf.int32), _P_MIN,
                              tf.constant(p_i, tf.float32), 4).numpy()
          for c in range(5) for step in range(20)])
      self.assertGreaterEqual(draws.min(), _P_MIN)
      self.assertLessEqual(draws.max(), p_i)
      if p_i > _P_MIN:
        self.assertLess(draws.max(), p_i)
        self.assertGreater(draws.max(), p_i - 0.1 * (p_i - _P_MIN))

  def test_training_moves_only_the_client_s_sub_network(self):
    # The loop's own result, before any mask is applied to the update.
    model = _SPEC.model_fn()
    loop = aequa.build_sandwich_loop_fn(_P_MIN, 1.0, 2)(model, _sgd(0.5))
    start = _SPEC.initial_weights(0)
    trained = loop(start, _dataset(2), tf.constant([3, 1], tf.int32),
                   tf.constant(0.5))
    self.assertEqual(int(trained['num_examples']), _SIZES[2])
    for before, after, mask in zip(start.trainable,
                                   trained['weights'].trainable,
                                   _masks(0.5)):
      moved = np.abs(after.numpy() - before) > 0
      self.assertFalse(np.any(moved & (mask == 0)))
      self.assertGreater(moved[mask == 1].mean(), 0.5)


class AequaRewardsTest(tff_test_utils.TffTestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Tracing takes seconds: build each process once.
    cls.process = _build(client_context=True)
    cls.w0 = _SPEC.initial_weights(0)
    cls.state = cls.process.set_model_weights(cls.process.initialize(),
                                              cls.w0)
    cls.output = cls.process.next_with_client_outputs(
        cls.state, [_input(c, w) for c, w in enumerate(_WIDTHS)])
    # Each client alone: with server SGD at 1.0 the model moves by exactly
    # its update on its sub-network (its seed does not depend on the
    # others).
    cls.alone = [
        cls.process.get_model_weights(
            cls.process.next(cls.state, [_input(c, w)]).state)
        for c, w in enumerate(_WIDTHS)]

  def _updates(self):
    """Each client's real (masked) update, read from its round alone."""
    return [[b - a for b, a in zip(self.w0.trainable, alone.trainable)]
            for alone in self.alone]

  def test_masked_aggregation_matches_numpy(self):
    updates = self._updates()
    masks = [_masks(w) for w in _WIDTHS]
    new = self.process.get_model_weights(self.output.state).trainable
    outside_all = 0
    for v, (old, got) in enumerate(zip(self.w0.trainable, new)):
      numerator = sum(n * m[v] * u[v]
                      for n, m, u in zip(_SIZES, masks, updates))
      denominator = sum(n * m[v] for n, m in zip(_SIZES, masks))
      expected = old - np.divide(numerator, denominator,
                                 out=np.zeros_like(old),
                                 where=denominator > 0)
      self.assertAllClose(got, expected, atol=2e-6, rtol=1e-5)
      # Outside every participant's sub-network: exactly unchanged.
      untrained = denominator == 0
      outside_all += untrained.sum()
      np.testing.assert_array_equal(got[untrained], old[untrained])
    self.assertGreater(outside_all, 1000)
    # Between widths 0.25 and 0.5 only the two 0.5 clients count: their
    # weighted mean, not the mean over all three.
    kernel = 2  # conv2's kernel [5, 5, 6, 16]: width 0.5 keeps 3 in, 8 out.
    band = ((masks[0][kernel] == 0) & (masks[1][kernel] == 1)
            & (np.abs(updates[1][kernel]) > 1e-4)
            & (np.abs(updates[2][kernel]) > 1e-4))
    self.assertGreater(band.sum(), 20)
    u1, u2 = updates[1][kernel][band], updates[2][kernel][band]
    self.assertAllClose(
        self.w0.trainable[kernel][band] - new[kernel][band],
        (100 * u1 + 140 * u2) / 240, rtol=1e-4, atol=1e-7)
    # A client's update is zero outside its own sub-network.
    for c, width in enumerate(_WIDTHS):
      for u, m in zip(updates[c], _masks(width)):
        np.testing.assert_array_equal(u[m == 0], 0)

  def test_bytes_shrink_with_the_width_and_count_the_sub_network(self):
    keras = _keras()
    full = sum(int(np.prod(v.shape)) for v in keras.trainable_variables)
    self.assertEqual(aequa_rewards.subnetwork_bytes(keras, 1.0), 4 * full)
    for client, width in zip(self.output.clients, _WIDTHS):
      expected = 4 * slimmable.active_parameter_count(keras, width)
      self.assertEqual(client['bytes_received'], expected)
      self.assertEqual(client['bytes_sent'], expected)
      self.assertEqual(client['bytes_received'],
                       aequa_rewards.subnetwork_bytes(keras, width))
    sent = [aequa_rewards.subnetwork_bytes(keras, w)
            for w in (0.25, 0.5, 0.75, 1.0)]
    self.assertEqual(sent, sorted(set(sent)))
    self.assertLess(sent[0], sent[-1] / 4)
    # The metrics carry the round's totals.
    totals = self.output.metrics['client_work']
    self.assertEqual(totals['bytes_sent'],
                     sum(c['bytes_sent'] for c in self.output.clients))
    self.assertEqual(totals['bytes_received'],
                     sum(c['bytes_received'] for c in self.output.clients))

  def test_min_width_updates_are_the_updates_on_the_p_min_sub_network(self):
    min_masks = _masks(_P_MIN)
    d_min = int(sum(m.sum() for m in min_masks))
    self.assertEqual(d_min, aequa_rewards.min_width_size(_keras(), _P_MIN))
    for client, update, size in zip(self.output.clients, self._updates(),
                                    _SIZES):
      expected = np.concatenate([u[m > 0] for u, m in zip(update,
                                                          min_masks)])
      self.assertEqual(client['min_width_update'].shape, (d_min,))
      self.assertAllClose(client['min_width_update'], expected, atol=1e-6)
      self.assertEqual(client['weight'], size)
    stacked = np.stack([c['min_width_update'] for c in self.output.clients])
    self.assertAllClose(
        self.output.metrics['aggregator']['min_width_aggregate'],
        np.average(stacked, axis=0, weights=_SIZES), atol=1e-6)

  def test_tracker_scores_a_client_sending_the_reverse_update_lowest(self):
    # Client 3 (width 1.0) reverses its update (model replacement, -1).
    inputs = [_input(c, w) for c, w in enumerate((0.25, 0.5, 1.0))]
    inputs.append(aequa_rewards.client_input(
        _dataset(2), 1.0, update_attacks.attack_spec(
            attacks.MODEL_REPLACEMENT, -1.0, seed=0, client_index=3)))
    output = self.process.next_with_client_outputs(self.state, inputs)
    scores = contribution.cosine_to_aggregate(
        {i: c['min_width_update'] for i, c in enumerate(output.clients)})
    self.assertLess(scores[3], 0.0)
    self.assertEqual(min(scores, key=scores.get), 3)
    self.assertGreater(min(scores[i] for i in range(3)), 0.2)

  def test_equals_build_aequa_when_every_client_has_p_max(self):
    rewards = _build(client_context=True, widths_per_step=2)
    plain = aequa.build_aequa(_SPEC.model_fn, _sgd(0.1), _sgd(1.0),
                              p_min=_P_MIN, widths_per_step=2,
                              client_context=True)
    results = []
    for process, make_input in (
        (rewards, lambda c, r: _input(c, 1.0, round_seed=r)),
        (plain, lambda c, r: fed_avg.client_input(
            _dataset(c), update_attacks.no_attack(seed=r, client_index=c)))):
      state = process.set_model_weights(process.initialize(), self.w0)
      for r in range(2):
        state = process.next(state, [make_input(c, r)
                                     for c in range(3)]).state
      results.append(process.get_model_weights(state).trainable)
    moved = sum(np.abs(a - b).sum()
                for a, b in zip(results[1], self.w0.trainable))
    self.assertGreater(moved, 1.0)
    for a, b in zip(*results):
      self.assertAllClose(a, b, atol=1e-6, rtol=1e-6)

  def test_untrained_parameters_keep_their_value_under_server_momentum(self):
    # Round 1 trains every parameter, so a momentum buffer holds them all;
    # round 2 trains width 0.25 only: the rest must not move with it.
    process = aequa_rewards.build_aequa_rewards(
        _SPEC.model_fn, _sgd(0.1),
        tff.learning.optimizers.build_sgdm(learning_rate=1.0, momentum=0.9),
        keras_model_fn=_keras, p_min=_P_MIN, client_context=True)
    state = process.set_model_weights(process.initialize(), self.w0)
    state = process.next(state, [_input(2, 1.0)]).state
    after_one = process.get_model_weights(state).trainable
    state = process.next(state, [_input(c, _P_MIN, round_seed=1)
                                 for c in range(2)]).state
    after_two = process.get_model_weights(state).trainable
    for one, two, m in zip(after_one, after_two, _masks(_P_MIN)):
      np.testing.assert_array_equal(two[m == 0], one[m == 0])
      self.assertGreater(np.mean(two[m == 1] != one[m == 1]), 0.5)

  def test_plain_data_sets_train_every_client_at_p_max(self):
    # Without context: plain data sets, every client at p_max. No sampled
    # widths, so the seeds (derived vs. given) do not matter.
    process = _build(p_max=0.5, widths_per_step=0)
    self.assertEqual(process.next.type_signature.parameter[1].member,
                     aequa.plain_data_type(_SPEC.model_fn))
    with_context = _build(p_max=0.5, widths_per_step=0, client_context=True)
    got = process.get_model_weights(process.next(
        self.state, [_dataset(c) for c in range(3)]).state)
    expected = with_context.get_model_weights(with_context.next(
        self.state, [_input(c, 0.5) for c in range(3)]).state)
    for a, b in zip(got.trainable, expected.trainable):
      self.assertAllClose(a, b, atol=1e-7)
    for a, old, m in zip(got.trainable, self.w0.trainable, _masks(0.5)):
      np.testing.assert_array_equal(a[m == 0], old[m == 0])
    # A width outside [p_min, p_max] fails the round.
    for width in (0.2, 0.75):
      with self.assertRaisesRegex(Exception, 'max_width must lie in'):
        with_context.next(self.state, [_input(0, width)])

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, r'in \(0, 1\]'):
      aequa_rewards.client_input(_dataset(0), 0.0)
    with self.assertRaisesRegex(ValueError, 'exceeds p_max'):
      _build(p_max=0.2)
    with self.assertRaisesRegex(ValueError, 'widths_per_step'):
      _build(widths_per_step=-1)
    other = model_fns.build_model_spec(
        'slimmable_lenet', x_shape=(8, 8, 1), x_dtype=tf.float32,
        y_shape=(), num_classes=5)
    with self.assertRaisesRegex(ValueError, 'another architecture'):
      aequa_rewards.build_aequa_rewards(
          _SPEC.model_fn, _sgd(0.1),
          keras_model_fn=lambda: other.build_keras(None))


if __name__ == '__main__':
  tf.test.main()
