"""IAFL on real digits: shared counts, chosen others, mixtures, resets."""

import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tests.algorithms import digits_clients
from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import iafl
from tff_fair.algorithms import training_loop
from tff_fair.algorithms import update_attacks
from tff_fair.models import model_fns

_SPEC = model_fns.build_model_spec(
    'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
    num_classes=10)
_SIZES = (60, 100, 140, 100, 80)
_CONTRIBUTIONS = (1.0, 0.5, 0.25, 0.8, 0.0)
_CLIENTS = tuple(range(len(_SIZES)))
_NUM_CLIENTS = 6
_sgd = digits_clients.sgd
_DATA = digits_clients.Clients(_SIZES, _SPEC.model_fn)
_dataset = _DATA.dataset
_local_update = _DATA.local_update


def _expected_k(contributions, kappa):
  """ceil(gamma^(1 - kappa) (n - 1)), by hand."""
  p = np.maximum(np.array(contributions, np.float64), 0.0)
  gamma = p / p.max() if p.max() > 0 else np.zeros_like(p)
  return [math.ceil(round(g**(1 - kappa) * (len(p) - 1), 9)) if g > 0
          else 0 for g in gamma]


class SharingTest(tf.test.TestCase):

  def test_k_matches_the_formula(self):
    cases = (
        ((1.0, 0.5, 0.25, 0.8, 0.0), 0.5),
        ((1.0, 0.5, 0.25, 0.8, 0.0), 0.0),   # 0.5 * 4 = 2 exactly.
        ((1.0, 0.5, 0.25, 0.8, 0.0), 1.0),   # Everyone gets all others.
        ((60.0, 100.0, 140.0, 100.0, 80.0), 0.3),
        ((3.0, -1.0, 2.0), 0.5),             # Below 0 counts as 0.
        ((0.0, 0.0), 0.5),                   # Nobody contributed.
    )
    for contributions, kappa in cases:
      k = iafl.shared_counts(tf.constant(contributions, tf.float32),
                             tf.ones([len(contributions)]), kappa)
      self.assertAllEqual(k, _expected_k(contributions, kappa),
                          msg=f'{contributions}, kappa={kappa}')
    self.assertAllEqual(iafl.shared_counts(
        tf.constant([1.0, 0.5, 0.25, 0.8, 0.0]), tf.ones([5]), 0.0),
                        [4, 2, 1, 4, 0])
    # Absent clients get 0 and do not count in n or in max p.
    k = iafl.shared_counts(tf.constant([9.0, 1.0, 0.5, 0.25]),
                           tf.constant([0.0, 1.0, 1.0, 1.0]), 0.0)
    self.assertAllEqual(k, [0, 2, 1, 1])

  def test_chosen_others_are_k_random_other_participants(self):
    participants = tf.constant([1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    k = tf.constant([4, 2, 0, 1, 3, 0])
    counts = np.zeros([6, 6])
    for s in range(300):
      chosen = iafl.choose_others(k, participants,
                                  tf.constant([s, 7])).numpy()
      self.assertAllEqual(chosen.sum(axis=1), k)
      self.assertAllEqual(np.diag(chosen), np.zeros(6))
      self.assertAllEqual(chosen[:, 2], np.zeros(6))
      counts += chosen
    # Each of the 4 other participants equally likely: k/4 of the draws.
    for i, k_i in ((1, 2), (3, 1), (4, 3)):
      others = [j for j in (0, 1, 3, 4, 5) if j != i]
      self.assertAllClose(counts[i, others] / 300, [k_i / 4] * 4, atol=0.1)
    same = iafl.choose_others(k, participants, tf.constant([5, 7]))
    self.assertAllEqual(same, iafl.choose_others(k, participants,
                                                 tf.constant([5, 7])))


class IaflTest(tff_test_utils.TffTestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Tracing takes seconds: build each process once.
    cls.process = iafl.build_iafl(
        _SPEC.model_fn, _sgd(), num_clients=_NUM_CLIENTS, kappa=0.5,
        contribution_input=True, client_context=True)
    # Data sizes as contributions, another seed, every client reset.
    cls.resetting = iafl.build_iafl(
        _SPEC.model_fn, _sgd(), num_clients=_NUM_CLIENTS, kappa=0.0, seed=1,
        reset_probability=1.0, client_context=True)
    cls.w0 = _SPEC.initial_weights(0)

  def _state(self, process):
    return process.set_model_weights(process.initialize(), self.w0)

  def _round(self, models, state, round_seed=0, contributions=True):
    extras = ([dict(contribution=c) for c in _CONTRIBUTIONS]
              if contributions else None)
    return models.round(state, _CLIENTS, [_dataset(c) for c in _CLIENTS],
                        round_seed=round_seed, extras=extras)

  def _check_mixtures(self, output, starts, server_start):
    """Each client's model: its start minus the weighted mean of its own
    and its chosen others' updates; the server's: minus all of them."""
    updates = [_local_update(start, c) for c, start in zip(_CLIENTS, starts)]
    for c, values in enumerate(output.clients):
      chosen = np.flatnonzero(values['chosen'])
      self.assertLen(chosen, values['k'])
      self.assertNotIn(c, chosen)
      group = [c, *chosen]
      weights = np.array([_SIZES[j] for j in group], np.float64)
      for v, (start, got) in enumerate(zip(starts[c].trainable,
                                           values['model'].trainable)):
        mean = np.average([updates[j][v] for j in group], axis=0,
                          weights=weights)
        self.assertAllClose(got, start - mean, atol=2e-6)
    server = self.process.get_model_weights(output.state)
    for v, (start, got) in enumerate(zip(server_start.trainable,
                                         server.trainable)):
      mean = np.average([u[v] for u in updates], axis=0, weights=_SIZES)
      self.assertAllClose(got, start - mean, atol=2e-6)

  def test_server_optimizer_moves_the_server_model_not_the_mixtures(self):
    # TFF's parts: the server optimizer acts on the server model (what a
    # reset client receives); the mixtures are of the raw updates.
    adam = iafl.build_iafl(
        _SPEC.model_fn, _sgd(),
        tff.learning.optimizers.build_adam(learning_rate=0.01),
        num_clients=_NUM_CLIENTS, kappa=0.5, contribution_input=True,
        client_context=True)
    outputs = [self._round(client_outputs.ClientModels(p), self._state(p))
               for p in (self.process, adam)]
    for sgd_client, adam_client in zip(*(o.clients for o in outputs)):
      self.assertAllEqual(sgd_client['chosen'], adam_client['chosen'])
      for a, b in zip(sgd_client['model'].trainable,
                      adam_client['model'].trainable):
        self.assertAllClose(a, b, atol=1e-6)
    server = adam.get_model_weights(outputs[1].state)
    moved = np.concatenate([np.ravel(np.abs(a - b)) for a, b in zip(
        self.w0.trainable, server.trainable)])
    # Adam's first step moves every weight by about its learning rate.
    self.assertAllClose(np.median(moved), 0.01, rtol=0.1)

  def test_each_client_averages_its_own_and_the_chosen_updates(self):
    models = client_outputs.ClientModels(self.process)
    output = self._round(models, self._state(self.process))
    k = [values['k'] for values in output.clients]
    self.assertAllEqual(k, _expected_k(_CONTRIBUTIONS, 0.5))
    self.assertAllEqual(k, [4, 3, 2, 4, 0])
    self.assertAllEqual(output.metrics['reward']['k'], k + [0])
    self.assertAllEqual(output.metrics['reward']['participants'],
                        [1, 1, 1, 1, 1, 0])
    self.assertFalse(any(values['reset'] for values in output.clients))
    self._check_mixtures(output, [self.w0] * len(_CLIENTS), self.w0)
    # Round 2 trains each client from its own model.
    starts = [models[c] for c in _CLIENTS]
    server = self.process.get_model_weights(output.state)
    output = self._round(models, output.state, round_seed=1)
    self._check_mixtures(output, starts, server)

  def test_draws_are_determined_by_the_seed(self):
    runs = []
    for process in (self.process, self.process, self.resetting):
      output = self._round(client_outputs.ClientModels(process),
                           self._state(process),
                           contributions=process is self.process)
      runs.append(output)
    for a, b in zip(runs[0].clients, runs[1].clients):
      self.assertAllEqual(a['chosen'], b['chosen'])
      for x, y in zip(a['model'].trainable, b['model'].trainable):
        np.testing.assert_array_equal(x, y)
    self.assertNotAllEqual(
        np.stack([c['chosen'] for c in runs[0].clients]),
        np.stack([c['chosen'] for c in runs[2].clients]))

  def test_data_sizes_are_the_default_contributions_and_resets(self):
    output = self._round(client_outputs.ClientModels(self.resetting),
                         self._state(self.resetting), contributions=False)
    metrics = output.metrics['reward']
    self.assertAllEqual(metrics['contributions'], [*_SIZES, 0])
    self.assertAllEqual(metrics['k'], [*_expected_k(_SIZES, 0.0), 0])
    self.assertAllEqual(metrics['k'], [2, 3, 4, 3, 3, 0])
    # Reset with probability 1: every model is the new server model.
    self.assertAllEqual(metrics['resets'], [1, 1, 1, 1, 1, 0])
    server = self.resetting.get_model_weights(output.state)
    for values in output.clients:
      self.assertTrue(values['reset'])
      for a, b in zip(values['model'].trainable, server.trainable):
        np.testing.assert_array_equal(a, b)

  def test_plain_data_sets_train_fed_avg(self):
    plain = iafl.build_iafl(_SPEC.model_fn, _sgd(),
                            num_clients=_NUM_CLIENTS)
    self.assertEqual(plain.next.type_signature.parameter[1].member,
                     training_loop.data_type_of(_SPEC.model_fn))
    output = plain.next_with_client_outputs(
        self._state(plain), [_dataset(c) for c in _CLIENTS])
    updates = [_local_update(self.w0, c) for c in _CLIENTS]
    server = plain.get_model_weights(output.state)
    for v, (start, got) in enumerate(zip(self.w0.trainable,
                                         server.trainable)):
      mean = np.average([u[v] for u in updates], axis=0, weights=_SIZES)
      self.assertAllClose(got, start - mean, atol=2e-6)
    for values in output.clients:
      self.assertEqual(values['k'], 0)
      for a, b in zip(values['model'].trainable, server.trainable):
        np.testing.assert_array_equal(a, b)
    self.assertAllEqual(output.metrics['reward']['participants'],
                        np.zeros(_NUM_CLIENTS))

  def test_bad_arguments(self):
    for kwargs, message in (
        (dict(num_clients=0), 'num_clients'),
        (dict(num_clients=3, kappa=1.5), 'kappa'),
        (dict(num_clients=3, reset_probability=-0.1), 'reset_probability'),
        (dict(num_clients=3, contribution_input=True),
         'contribution_input needs client_context')):
      with self.assertRaisesRegex(ValueError, message):
        iafl.build_iafl(_SPEC.model_fn, _sgd(), **kwargs)
    with self.assertRaisesRegex(Exception, 'client index must be <'):
      self.resetting.next(self._state(self.resetting), [iafl.client_input(
          _dataset(0), self.w0,
          update_attacks.no_attack(client_index=_NUM_CLIENTS))])


if __name__ == '__main__':
  tf.test.main()
