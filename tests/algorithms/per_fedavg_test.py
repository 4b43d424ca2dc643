"""Per-FedAvg on real digits: the meta-steps by hand, the process, adaptation."""

import collections
import itertools

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tests.algorithms import digits_clients
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import per_fedavg
from tff_fair.data.sources import digits
from tff_fair.models import model_fns

_SPEC = model_fns.build_model_spec(
    'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
    num_classes=10)
_DIGITS = digits.load_digits()
_ALPHA, _BETA, _DELTA = 0.05, 0.1, 1e-3


def _batches(rows, batch=10):
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=_DIGITS.x[rows], y=_DIGITS.y[rows])).batch(batch)


def _eager_meta_steps(start, data, variant, hessian_product):
  """The module docstring's rule, step by step on a Keras model."""
  model = _SPEC.build_keras(0)
  variables = model.trainable_variables
  for v, t in zip(variables, start.trainable):
    v.assign(t)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def grad_at(values, batch):
    for v, t in zip(variables, values):
      v.assign(t)
    with tf.GradientTape() as tape:
      loss = loss_fn(batch['y'], model(batch['x'], training=True))
    return [g.numpy() for g in tape.gradient(loss, variables)]

  def hessian_times(values, vector, batch):
    for v, t in zip(variables, values):
      v.assign(t)
    with tf.GradientTape() as outer:
      with tf.GradientTape() as inner:
        loss = loss_fn(batch['y'], model(batch['x'], training=True))
      directional = tf.add_n([
          tf.reduce_sum(g * u)
          for g, u in zip(inner.gradient(loss, variables), vector)])
    return [h.numpy() for h in outer.gradient(directional, variables)]

  batches = list(data)
  per_step = 2 if variant == 'fo' else 3
  theta = [np.asarray(t) for t in start.trainable]
  for i in range(len(batches)):
    group = [batches[(i + k) % len(batches)] for k in range(per_step)]
    adapted = [t - _ALPHA * g for t, g in zip(theta, grad_at(theta, group[0]))]
    meta = grad_at(adapted, group[1])
    if variant == 'hf' and hessian_product == 'exact':
      meta = [g - _ALPHA * h
              for g, h in zip(meta, hessian_times(theta, meta, group[2]))]
    elif variant == 'hf':
      plus = grad_at([t + _DELTA * g for t, g in zip(theta, meta)], group[2])
      minus = grad_at([t - _DELTA * g for t, g in zip(theta, meta)], group[2])
      meta = [g - _ALPHA * (p - m) / (2 * _DELTA)
              for g, p, m in zip(meta, plus, minus)]
    theta = [t - _BETA * g for t, g in zip(theta, meta)]
  return theta


class PerFedAvgTest(tff_test_utils.TffTestCase):

  def test_meta_steps_match_the_rule(self):
    # 43 examples: 5 batches, the last of 3: five meta-steps, the last ones
    # reading the first batches again. 10: one batch, D, D' and D'' alike.
    start = _SPEC.initial_weights(1)
    cases = [(examples, 'fo', 'exact') for examples in (43, 10)] + list(
        itertools.product((43, 10), ['hf'], per_fedavg.HESSIAN_PRODUCTS))
    for examples, variant, product in cases:
      with self.subTest(examples=examples, variant=variant, product=product):
        data = _batches(slice(0, examples))
        loop = per_fedavg.build_meta_loop(_ALPHA, variant, _DELTA, product)(
            _SPEC.model_fn(),
            tff.learning.optimizers.build_sgdm(learning_rate=_BETA))
        trained = loop(start, data, tf.zeros([2], tf.int32))
        self.assertAllClose(trained['weights'].trainable,
                            _eager_meta_steps(start, data, variant, product),
                            atol=2e-5, rtol=1e-4)
        self.assertNotAllClose(trained['weights'].trainable, start.trainable)
        # The client's examples, each counted once, as FedAvg's weight.
        self.assertEqual(int(trained['num_examples']), examples)

  def test_bad_arguments(self):
    for kwargs, message in ((dict(alpha=0.0), 'alpha'),
                            (dict(alpha=0.1, variant='so'), 'variant'),
                            (dict(alpha=0.1, variant='hf',
                                  hessian_product='gauss_newton'),
                             'Hessian-vector product'),
                            (dict(alpha=0.1, delta=float('nan')), 'delta')):
      with self.assertRaisesRegex(ValueError, message):
        per_fedavg.build_per_fedavg(_SPEC.model_fn, digits_clients.sgd(),
                                    **kwargs)

  def test_adapted_models_fit_label_skewed_clients_better(self):
    # Each client holds two digit classes; after a few federated rounds
    # the global model is spread over ten classes, one adaptation step on
    # a client's training data fits its two.
    x, y = _DIGITS.x, _DIGITS.y
    pairs = ((0, 1), (2, 3), (4, 5), (6, 7))
    rows = [np.flatnonzero(np.isin(y, pair)) for pair in pairs]
    train = [_batches(r[:120], 20) for r in rows]
    test = [(x[r[120:200]], y[r[120:200]]) for r in rows]
    process = per_fedavg.build_per_fedavg(
        _SPEC.model_fn, digits_clients.sgd(0.1), alpha=0.1)
    state = process.set_model_weights(process.initialize(),
                                      _SPEC.initial_weights(0))
    for _ in range(8):
      state = process.next(state, [d.repeat(2) for d in train]).state
    global_weights = process.get_model_weights(state)
    adapted = per_fedavg.build_adaptation(_SPEC.model_fn, alpha=0.1,
                                          steps=2)(global_weights, train)
    model = _SPEC.build_keras(0)

    def accuracy(weights, xs, ys):
      weights.assign_weights_to(model)
      return float(np.mean(np.argmax(model(xs), -1) == ys))

    before = [accuracy(global_weights, *t) for t in test]
    after = [accuracy(w, *t) for w, t in zip(adapted, test)]
    self.assertGreater(np.mean(after), np.mean(before) + 0.1,
                       (before, after))

  def test_plain_datasets_in_tff_s_training_loop(self):
    # `next` takes plain client datasets: TFF's own loop drives it.
    process = per_fedavg.build_per_fedavg(
        _SPEC.model_fn, digits_clients.sgd(0.1), alpha=0.05, variant='hf')
    data = [_batches(slice(i * 40, (i + 1) * 40)) for i in range(3)]
    released = []

    class Keep(tff.program.ReleaseManager):

      async def release(self, value, key=None):
        released.append(value)

    state = tff.simulation.run_training_process(
        process, lambda round_num: data, total_rounds=2,
        metrics_managers=[Keep()])
    self.assertLen(released, 2)
    self.assertGreater(
        released[-1]['client_work']['train']['num_examples'], 0)
    self.assertNotAllClose(process.get_model_weights(state).trainable[0],
                           process.get_model_weights(
                               process.initialize()).trainable[0])
    self.assertEqual(
        process.next.type_signature.parameter[1].member,
        tff.SequenceType(tff.types.tensorflow_to_type(
            _SPEC.model_fn().input_spec)))
    # Under client context it takes attack specs, like FedAvg.
    with_context = per_fedavg.build_per_fedavg(
        _SPEC.model_fn, digits_clients.sgd(0.1), client_context=True)
    with_context.next(with_context.initialize(),
                      [fed_avg.client_input(d) for d in data])


if __name__ == '__main__':
  tf.test.main()
