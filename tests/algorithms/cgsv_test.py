"""CGSV on real digits: reputations, rewards and sparsified aggregates."""

import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tests.algorithms import digits_clients
from tff_fair import attacks
from tff_fair.algorithms import cgsv
from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import training_loop
from tff_fair.algorithms import update_attacks
from tff_fair.models import model_fns

_SPEC = model_fns.build_model_spec(
    'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
    num_classes=10)
_SIZES = (60, 100, 140, 100)
_NUM_CLIENTS = 5
_sgd = digits_clients.sgd
_DATA = digits_clients.Clients(_SIZES, _SPEC.model_fn)
_dataset = _DATA.dataset
_local_update = _DATA.local_update


def _flat(arrays):
  return np.concatenate([np.ravel(a) for a in arrays])


class ReputationTest(tf.test.TestCase):

  def test_reputation_update_matches_hand_computation(self):
    # Round 1: reputations start at 0; client 3 did not take part.
    r = cgsv.update_reputations(
        tf.zeros([4]), tf.constant([0.9, 0.5, -0.2, 0.7]),
        tf.constant([1.0, 1.0, 1.0, 0.0]), alpha=0.95)
    # 0.05 * phi = 0.045, 0.025, -0.01 (clamped to 0.001); 0 -> 0.001;
    # sum 0.072.
    self.assertAllClose(r, [0.045 / 0.072, 0.025 / 0.072, 0.001 / 0.072,
                            0.001 / 0.072])
    # Round 2: client 3 still absent keeps its (renormalized) reputation.
    r2 = cgsv.update_reputations(
        r, tf.constant([0.5, 0.5, 0.5, 0.9]),
        tf.constant([1.0, 1.0, 1.0, 0.0]), alpha=0.95)
    moved = [0.95 * 0.625 + 0.025, 0.95 * 0.025 / 0.072 + 0.025,
             0.95 * 0.001 / 0.072 + 0.025, 0.001 / 0.072]
    self.assertAllClose(r2, np.array(moved) / sum(moved))
    self.assertAllClose(tf.reduce_sum(r2), 1.0)

  def test_reward_shares(self):
    r = tf.constant([0.625, 0.25, 0.125])
    q = cgsv.reward_shares(r, beta=2.0)
    self.assertAllClose(q, [1.0, math.tanh(0.5) / math.tanh(1.25),
                            math.tanh(0.25) / math.tanh(1.25)])
    # A larger beta evens the shares out.
    self.assertAllGreater(cgsv.reward_shares(r, beta=20.0)[1:] - q[1:], 0.0)

  def test_kept_entries_is_ceil_of_share_times_size(self):
    for share, size, kept in ((0.3, 10, 3), (1.0, 7, 7), (0.0, 5, 0),
                              (0.01, 10, 1), (0.5, 3, 2), (0.999, 1000, 999)):
      self.assertEqual(int(cgsv.kept_entries(tf.constant(share), size)),
                       kept)

  def test_sparsify_keeps_exactly_the_top_k_by_magnitude_per_layer(self):
    rng = np.random.default_rng(0)
    layers = [rng.normal(size=s).astype(np.float32)
              for s in ((5, 5, 1, 6), (6,), (64, 10), (1,))]
    for share in (0.0, 0.07, 0.3, 0.5, 1.0):
      kept = cgsv.sparsify(layers, tf.constant(share, tf.float32))
      for layer, out in zip(layers, kept):
        out = out.numpy()
        k = math.ceil(round(share * layer.size, 6))
        self.assertEqual(np.count_nonzero(out), k)
        top = np.argsort(-np.abs(layer), axis=None)[:k]
        np.testing.assert_array_equal(np.flatnonzero(out), np.sort(top))
        np.testing.assert_array_equal(out.ravel()[top], layer.ravel()[top])
    # Ties: the earlier entries are kept.
    tied = cgsv.sparsify([tf.constant([1.0, -1.0, 1.0, -1.0])], 0.5)[0]
    self.assertAllEqual(tied, [1.0, -1.0, 0.0, 0.0])


class CgsvTest(tff_test_utils.TffTestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Tracing takes seconds: build each process once.
    cls.process = cgsv.build_cgsv(_SPEC.model_fn, _sgd(),
                                  num_clients=_NUM_CLIENTS,
                                  client_context=True)
    cls.plain = cgsv.build_cgsv(_SPEC.model_fn, _sgd(),
                                num_clients=_NUM_CLIENTS)
    cls.w0 = _SPEC.initial_weights(0)

  def _state(self, process):
    return process.set_model_weights(process.initialize(), self.w0)

  def test_first_round_matches_numpy(self):
    clients = (0, 1, 2)
    output = client_outputs.ClientModels(self.process).round(
        self._state(self.process), clients, [_dataset(c) for c in clients])
    # By hand: normalized updates, data-size weights, cosines, reputations
    # from 0, shares (alpha 0.95, beta 1, Gamma 0.5).
    units = [0.5 * _flat(u) / (np.linalg.norm(_flat(u)) + 1e-7)
             for u in (_local_update(self.w0, c) for c in clients)]
    sizes = np.array([_SIZES[c] for c in clients], np.float64)
    aggregate = np.average(units, axis=0, weights=sizes)
    phis = [u @ aggregate / (np.linalg.norm(u) * np.linalg.norm(aggregate))
            for u in units]
    r = np.full(_NUM_CLIENTS, 1e-3)
    r[list(clients)] = np.maximum(0.05 * np.array(phis), 1e-3)
    r /= r.sum()
    q = np.tanh(r) / np.tanh(r).max()
    metrics = output.metrics['aggregator']
    self.assertAllClose(metrics['phis'], phis + [0.0, 0.0], atol=1e-5)
    self.assertAllEqual(metrics['participants'], [1, 1, 1, 0, 0])
    self.assertAllClose(metrics['reputations'], r, atol=1e-6)
    self.assertAllClose(metrics['rewards'], q, atol=1e-5)
    reputation = output.state.aggregator['reputation']
    self.assertAllClose(reputation['reputations'], r, atol=1e-6)
    self.assertEqual(reputation['round_num'], 1)
    # The server model moves by the aggregate.
    server = self.process.get_model_weights(output.state)
    moved = _flat(self.w0.trainable) - _flat(server.trainable)
    self.assertAllClose(moved, aggregate, atol=1e-6)
    # Client i gets the aggregate's top ceil(q_i * size) entries per layer.
    for c, values in zip(clients, output.clients):
      self.assertAllClose(values['reward'], q[c], atol=1e-5)
      self.assertAllClose(values['phi'], phis[c], atol=1e-5)
      self.assertAllClose(values['reputation'], r[c], atol=1e-6)
      for old, new, srv in zip(self.w0.trainable,
                               values['model'].trainable, server.trainable):
        # (Read back through weights: entries a hair apart may swap at the
        # k-th place, so only those clearly above or below it count.)
        received, full = np.abs(old - new), np.abs(old - srv)
        k = int(cgsv.kept_entries(values['reward'], full.size))
        if k == 0:
          np.testing.assert_array_equal(received, 0)
          continue
        threshold = np.sort(full, axis=None)[::-1][k - 1]
        above, below = full > threshold + 1e-6, full < threshold - 1e-6
        self.assertAllClose(received[above], full[above], atol=1e-6)
        np.testing.assert_array_equal(new[below], old[below])
        self.assertGreater(above.sum(), 0.5 * k)
    self.assertLess(q.min(), 1.0)

  def test_a_client_sending_the_reversed_update_gets_the_lowest_reputation(
      self):
    # Client 3 sends minus its update (model replacement with scale -1):
    # the direction opposite to what the others agree on.
    models = client_outputs.ClientModels(self.process)
    state = self._state(self.process)
    clients = (0, 1, 2, 3)
    for round_num in range(3):
      specs = [update_attacks.attack_spec(
          attacks.MODEL_REPLACEMENT if c == 3 else attacks.NONE, -1.0,
          seed=round_num, client_index=c) for c in clients]
      output = models.round(state, clients, [_dataset(c) for c in clients],
                            attacks=specs)
      state = output.state
    metrics = output.metrics['aggregator']
    reputations = metrics['reputations'][:4]
    self.assertEqual(np.argmin(reputations), 3)
    self.assertLess(metrics['phis'][3], 0.0)
    self.assertAllGreater(metrics['phis'][:3], 0.5)
    self.assertLess(reputations[3], 0.01)
    self.assertAllGreater(reputations[:3], 0.2)
    self.assertEqual(np.argmin(metrics['rewards'][:4]), 3)
    self.assertLess(metrics['rewards'][3], 0.05)
    # Its model received the fewest entries; the kept models are the ones
    # the round returned.
    counts = [sum(np.count_nonzero(a != b) for a, b in zip(
        self.w0.trainable, models[c].trainable)) for c in clients]
    self.assertEqual(np.argmin(counts), 3)
    self.assertLess(counts[3], min(counts[:3]) / 10)
    for c, values in zip(clients, output.clients):
      for a, b in zip(models[c].trainable, values['model'].trainable):
        np.testing.assert_array_equal(a, b)

  def test_plain_data_sets_weigh_by_data_size_and_reward_everyone_fully(
      self):
    self.assertEqual(self.plain.next.type_signature.parameter[1].member,
                     training_loop.data_type_of(_SPEC.model_fn))
    output = self.plain.next_with_client_outputs(
        self._state(self.plain), [_dataset(c) for c in (0, 1, 2)])
    metrics = output.metrics['aggregator']
    self.assertAllEqual(metrics['reputations'], np.zeros(_NUM_CLIENTS))
    self.assertAllEqual(metrics['rewards'], np.ones(_NUM_CLIENTS))
    self.assertAllEqual(metrics['phis'], np.zeros(_NUM_CLIENTS))
    # The first round of CGSV with context weighs by data size too, so the
    # server models agree; every client's model is the server's.
    with_context = self.process.next(
        self._state(self.process),
        [client_outputs.model_client_input(
            _dataset(c), self.w0, update_attacks.no_attack(client_index=c))
         for c in (0, 1, 2)])
    server = self.plain.get_model_weights(output.state)
    for a, b in zip(server.trainable, self.process.get_model_weights(
        with_context.state).trainable):
      self.assertAllClose(a, b, atol=1e-7)
    for values in output.clients:
      for a, b in zip(values['model'].trainable, server.trainable):
        self.assertAllClose(a, b, atol=1e-7)

  def test_server_optimizer_moves_the_server_model_not_the_rewards(self):
    # TFF's parts: the server optimizer acts on the server model only;
    # each client's reward is the reputation-weighted aggregate itself.
    clients = (0, 1, 2)
    adam = cgsv.build_cgsv(
        _SPEC.model_fn, _sgd(),
        tff.learning.optimizers.build_adam(learning_rate=0.01),
        num_clients=_NUM_CLIENTS, client_context=True)
    outputs = [client_outputs.ClientModels(p).round(
        self._state(p), clients, [_dataset(c) for c in clients])
               for p in (self.process, adam)]
    for sgd_client, adam_client in zip(*(o.clients for o in outputs)):
      for a, b in zip(sgd_client['model'].trainable,
                      adam_client['model'].trainable):
        self.assertAllClose(a, b, atol=1e-6)
    sgd_server, adam_server = (
        _flat(p.get_model_weights(o.state).trainable)
        for p, o in zip((self.process, adam), outputs))
    # Adam's first step moves every weight by about its learning rate.
    moved = np.abs(_flat(self.w0.trainable) - adam_server)
    self.assertAllClose(np.median(moved), 0.01, rtol=0.1)
    self.assertGreater(np.max(np.abs(sgd_server - adam_server)), 1e-3)

  def test_a_weighted_aggregator_computes_the_weighted_mean(self):
    clients = (0, 1, 2)
    robust = cgsv.build_cgsv(
        _SPEC.model_fn, _sgd(), num_clients=_NUM_CLIENTS,
        model_aggregator=tff.learning.robust_aggregator(zeroing=False),
        client_context=True)
    outputs = [client_outputs.ClientModels(p).round(
        self._state(p), clients, [_dataset(c) for c in clients])
               for p in (self.process, robust)]
    # Normalized updates (norm 0.5) stay under the initial clipping norm
    # (1.0): the same round, and the clipping norm is released.
    self.assertAllClose(outputs[0].metrics['aggregator']['reputations'],
                        outputs[1].metrics['aggregator']['reputations'],
                        atol=1e-6)
    self.assertEqual(
        outputs[1].metrics['aggregator']['aggregation']['clipped_count'], 0)
    with self.assertRaisesRegex(TypeError, 'weighted'):
      cgsv.build_cgsv(_SPEC.model_fn, _sgd(), num_clients=_NUM_CLIENTS,
                      model_aggregator=tff.learning.dp_aggregator(
                          noise_multiplier=0.1, clients_per_round=3))

  def test_an_index_outside_the_clients_fails_the_round(self):
    with self.assertRaisesRegex(Exception, 'client index must be <'):
      self.process.next(self._state(self.process), [
          client_outputs.model_client_input(
              _dataset(0), self.w0,
              update_attacks.no_attack(client_index=_NUM_CLIENTS))])

  def test_bad_arguments(self):
    for kwargs, message in ((dict(num_clients=0), 'num_clients'),
                            (dict(num_clients=3, alpha=1.5), 'alpha'),
                            (dict(num_clients=3, beta=0.0), 'beta'),
                            (dict(num_clients=3, norm_gamma=-1.0),
                             'norm_gamma')):
      with self.assertRaisesRegex(ValueError, message):
        cgsv.build_cgsv(_SPEC.model_fn, _sgd(), **kwargs)


if __name__ == '__main__':
  tf.test.main()
