"""Ditto and the attack-capable FedAvg on real digits."""

import collections

import numpy as np
from sklearn import datasets as sk_datasets
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tff_fair import attacks
from tff_fair.algorithms import ditto
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import per_client_training
from tff_fair.algorithms import update_attacks
from tff_fair.models import model_fns

_DIGITS = sk_datasets.load_digits()
_X = (_DIGITS.images / 16.0).astype(np.float32)[..., None]
_Y = _DIGITS.target.astype(np.int32)


def _dataset(client, size=100, batch=20):
  rows = slice(client * size, (client + 1) * size)
  return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=_X[rows], y=_Y[rows])).batch(batch)


def _sgd(lr=0.1):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


def _distance(a, b):
  return np.sqrt(sum(np.sum((x - y)**2)
                     for x, y in zip(a.trainable, b.trainable)))


_SPEC = model_fns.build_model_spec(
    'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
    num_classes=10)


def _build_ditto(aggregator=None, average=True):
  return ditto.build_ditto(
      _SPEC.model_fn, _sgd(), _sgd(1.0), personal_optimizer_fn=_sgd(),
      model_aggregator=aggregator, average_personal_iterates=average)


class DittoTest(tff_test_utils.TffTestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Tracing a process takes seconds: build the shared ones once.
    cls.ditto_process = _build_ditto()
    cls.last_iterate_process = _build_ditto(average=False)
    # With attack specs in its client input (what tff_fair.training runs).
    cls.fed_avg_process = fed_avg.build_fed_avg(_SPEC.model_fn, _sgd(),
                                                _sgd(1.0),
                                                client_context=True)

  def setUp(self):
    super().setUp()
    self.spec = _SPEC
    self.w0 = _SPEC.initial_weights(seed=0)

  def _ditto(self, aggregator=None):
    return (self.ditto_process if aggregator is None
            else _build_ditto(aggregator))

  def _state(self, process):
    return process.set_model_weights(process.initialize(), self.w0)

  def test_benign_fed_avg_equals_tff_fed_avg(self):
    theirs = tff.learning.algorithms.build_weighted_fed_avg(
        self.spec.model_fn, client_optimizer_fn=_sgd(),
        server_optimizer_fn=_sgd(1.0))
    b = theirs.next(theirs.set_model_weights(theirs.initialize(), self.w0),
                    [_dataset(i) for i in range(3)])
    # Ditto's `next` is our FedAvg's default (plain data sets, as TFF's);
    # the client-context FedAvg gets benign attack specs.
    plain, context = self.ditto_process, self.fed_avg_process
    # The same client input as TFF's (the state differs: TFF's client work
    # keeps the client optimizer's hyperparameters, ours keeps nothing).
    self.assertEqual(plain.next.type_signature.parameter[1],
                     theirs.next.type_signature.parameter[1])
    for ours, inputs in (
        (plain, [_dataset(i) for i in range(3)]),
        (context, [fed_avg.client_input(_dataset(i)) for i in range(3)])):
      a = ours.next(self._state(ours), inputs)
      self.assertAllClose(ours.get_model_weights(a.state).trainable,
                          theirs.get_model_weights(b.state).trainable)
      self.assertEqual(a.metrics['client_work']['train'],
                       b.metrics['client_work']['train'])

  def test_update_attacks(self):
    process = self.fed_avg_process
    state = self._state(process)

    def update(spec):
      out = process.next(state, [fed_avg.client_input(_dataset(0), spec)])
      return [w - v for w, v in zip(
          process.get_model_weights(out.state).trainable, self.w0.trainable)]

    honest = update(None)
    replaced = update(update_attacks.attack_spec(
        attacks.MODEL_REPLACEMENT, 10.0, seed=1, client_index=0))
    self.assertAllClose([10 * h for h in honest], replaced, rtol=1e-4,
                        atol=1e-6)
    noise = update(update_attacks.attack_spec(
        attacks.RANDOM_UPDATES, 1.0, seed=1, client_index=0))
    for h, n in zip(honest, noise):
      if h.size > 100:  # Std of large tensors is well estimated.
        self.assertAllClose(np.std(n), np.std(h), rtol=0.2)
        self.assertLess(abs(np.corrcoef(h.ravel(), n.ravel())[0, 1]), 0.2)

  def _assert_fused_equals_unfused(self, process, state, clients,
                                   next_inputs):
    """`personalize_and_next` against `personalize`, then `next`."""
    fused = process.personalize_and_next(state, clients)
    personal = process.personalize(state, [
        collections.OrderedDict(data=c['data'], personal=c['personal'],
                                lam=c['lam']) for c in clients])
    unfused = process.next(state, next_inputs)
    self.assertAllClose(
        process.get_model_weights(fused.state).trainable,
        process.get_model_weights(unfused.state).trainable,
        atol=1e-6, rtol=1e-5)
    self.assertAllClose(fused.metrics, unfused.metrics, rtol=1e-5)
    self.assertLen(fused.clients, len(clients))
    for got, want in zip(fused.clients, personal):
      self.assertAllClose(got['personal'].trainable,
                          want['personal'].trainable, atol=1e-6, rtol=1e-5)
      self.assertAllClose(got['loss'], want['loss'], rtol=1e-5)
      self.assertEqual(got['num_examples'], want['num_examples'])
    # Not vacuous: the round moved both models.
    self.assertGreater(_distance(process.get_model_weights(fused.state),
                                 process.get_model_weights(state)), 0.01)
    self.assertGreater(
        _distance(fused.clients[0]['personal'], clients[0]['personal']),
        0.01)
    return fused

  def test_personalize_and_next_equals_personalize_then_next(self):
    # Personal starts differ from w^t and between clients, lambdas too; the
    # state is one round in (a moved w^t).
    for process in (self.ditto_process, self.last_iterate_process):
      with self.subTest(average=process is self.ditto_process):
        state = process.next(self._state(process),
                             [_dataset(i) for i in range(3)]).state
        clients = [
            ditto.paired_input(_dataset(i), self.spec.initial_weights(
                seed=10 + i), lam)
            for i, lam in zip(range(3), (0.0, 0.1, 2.0))]
        self._assert_fused_equals_unfused(
            process, state, clients, [c['data'] for c in clients])

  def test_personalize_and_next_under_client_context(self):
    process = ditto.build_ditto(
        _SPEC.model_fn, _sgd(), _sgd(1.0), personal_optimizer_fn=_sgd(),
        client_context=True)
    attack = update_attacks.attack_spec(attacks.MODEL_REPLACEMENT, 10.0,
                                        seed=1, client_index=1)
    specs = (None, attack)
    clients = [ditto.paired_input(_dataset(i), self.w0, 0.5,
                                  client_context=True, attack=spec)
               for i, spec in enumerate(specs)]
    fused = self._assert_fused_equals_unfused(
        process, self._state(process), clients,
        [fed_avg.client_input(_dataset(i), spec)
         for i, spec in enumerate(specs)])
    # The attack reached the global model and not the personal ones: the
    # attacker's personal model is the honest one's computation.
    benign = process.personalize_and_next(
        self._state(process),
        [ditto.paired_input(_dataset(i), self.w0, 0.5, client_context=True)
         for i in range(2)])
    self.assertAllClose(fused.clients[1]['personal'].trainable,
                        benign.clients[1]['personal'].trainable)
    # Scaled by 10 on one client of two: 4.5x that client's update apart.
    benign_weights = process.get_model_weights(benign.state)
    self.assertGreater(
        _distance(process.get_model_weights(fused.state), benign_weights),
        2 * _distance(benign_weights, self.w0))

  def test_paired_input_refuses_an_attack_without_client_context(self):
    with self.assertRaisesRegex(ValueError, 'client_context'):
      ditto.paired_input(_dataset(0), self.w0, 0.5,
                         attack=update_attacks.no_attack())

  def test_lambda_pulls_personal_model_to_global(self):
    process = self._ditto()
    state = self._state(process)
    start = self.spec.initial_weights(seed=5)  # A personal model != w^t.
    lambdas = [0.0, 0.1, 1.0, 10.0]
    outs = process.personalize(state, [
        ditto.personal_input(_dataset(1), start, lam) for lam in lambdas])
    distances = [_distance(o['personal'], self.w0) for o in outs]
    self.assertEqual(distances, sorted(distances, reverse=True), distances)
    self.assertLess(distances[-1], 0.9 * distances[0])

  def test_one_personal_step_matches_hand_computation(self):
    # v' = v - lr * (grad F(v; b) + lam * (v - w^t)) for one batch b, with
    # grad F from Keras directly. v - w^t is large (two random inits), so
    # 2 * lam, lam / 2 or an anchor other than w^t would be far off.
    lr, lam = 0.1, 1.0
    process = self._ditto()
    v = self.spec.initial_weights(seed=5)
    batch = next(iter(_dataset(1, size=20, batch=20)))
    out, = process.personalize(self._state(process), [
        ditto.personal_input(_dataset(1, size=20, batch=20), v, lam)])
    model = self.spec.build_keras(None)
    v.assign_weights_to(model)
    with tf.GradientTape() as tape:
      loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
          batch['y'], model(batch['x'], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    expected = [v_i - lr * (g.numpy() + lam * (v_i - w_i))
                for v_i, g, w_i in zip(v.trainable, grads,
                                       self.w0.trainable)]
    self.assertAllClose(out['personal'].trainable, expected, atol=1e-5,
                        rtol=1e-4)
    self.assertAllClose(out['loss'], loss.numpy(), rtol=1e-5)
    # The proximal part of the step is far above the tolerance above.
    prox = max(np.abs(lr * lam * (v_i - w_i)).max()
               for v_i, w_i in zip(v.trainable, self.w0.trainable))
    self.assertGreater(prox / 2, 1e-2)

  def test_personal_model_is_the_average_of_the_round_s_iterates(self):
    # Three batches of 20: the kept model is (v1 + v2 + v3) / 3, where v_k
    # is the last iterate after the first k batches.
    state = self._state(self.ditto_process)
    v = self.spec.initial_weights(seed=5)

    def personalize(process, batches):
      rows = slice(100, 100 + 20 * batches)  # The same first batches.
      data = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          x=_X[rows], y=_Y[rows])).batch(20)
      out, = process.personalize(state, [ditto.personal_input(data, v, 1.0)])
      return out['personal'].trainable

    iterates = [personalize(self.last_iterate_process, k) for k in (1, 2, 3)]
    averaged = personalize(self.ditto_process, 3)
    self.assertAllClose(
        averaged, [np.mean(ws, axis=0) for ws in zip(*iterates)],
        atol=1e-5, rtol=1e-4)
    self.assertNotAllClose(averaged, iterates[-1])

  def test_lambda_zero_is_plain_local_training(self):
    process = self.last_iterate_process
    out, = process.personalize(self._state(process), [
        ditto.personal_input(_dataset(2), self.w0, 0.0)])
    local = per_client_training.build_client_train_fn(
        self.spec.model_fn, _sgd(), epochs=1)(self.w0, _dataset(2))
    self.assertAllClose(out['personal'].trainable, local.trainable)
    self.assertEqual(out['num_examples'], 100)

  def test_personal_models_never_reach_the_server(self):
    process = self._ditto()
    self.assertIsInstance(process, tff.learning.templates.LearningProcess)
    next_result = process.next.type_signature.result
    self.assertEqual(next_result.state.placement, tff.SERVER)
    self.assertEqual(next_result.metrics.placement, tff.SERVER)
    personal_result = process.personalize.type_signature.result
    self.assertEqual(personal_result.placement, tff.CLIENTS)
    self.assertFalse(personal_result.all_equal)
    # The state type is exactly FedAvg's: nothing per client in it.
    self.assertEqual(process.initialize.type_signature,
                     self.fed_avg_process.initialize.type_signature)

  def test_runs_in_tff_simulation_loop(self):
    process = self._ditto()
    rounds = []

    def select(round_num):
      rounds.append(round_num)
      return [_dataset(i) for i in range(2)]

    state = tff.simulation.run_training_process(
        process, select, total_rounds=2)
    self.assertEqual(rounds, [1, 2])
    weights = process.get_model_weights(state)
    self.assertTrue(all(np.isfinite(w).all() for w in weights.trainable))

  def test_bad_lambda_is_refused_before_any_computation(self):
    for lam in (-0.1, float('nan'), float('inf'), '1'):
      with self.assertRaisesRegex(ValueError, "lambda must be a finite"):
        ditto.personal_input(_dataset(0), self.w0, lam)
    ditto.personal_input(_dataset(0), self.w0, np.float32(0.5))

  def test_composes_with_tff_aggregators(self):
    for aggregator in (
        tff.learning.robust_aggregator(),
        tff.learning.dp_aggregator(noise_multiplier=0.1, clients_per_round=2),
        tff.learning.compression_aggregator(),
    ):
      # The aggregator only enters `next`; `personalize` is tested above.
      process = self._ditto(aggregator)
      state = process.next(self._state(process),
                           [_dataset(i) for i in range(2)]).state
      moved = _distance(process.get_model_weights(state), self.w0)
      self.assertGreater(moved, 0.0, type(aggregator).__name__)
      self.assertTrue(np.isfinite(moved))


if __name__ == '__main__':
  tf.test.main()
