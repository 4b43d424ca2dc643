"""FedDF's parts on real digits: the distillation step and the process."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tests.algorithms import digits_clients
from tff_fair.algorithms import distillation
from tff_fair.algorithms import feddf
from tff_fair.data.sources import digits
from tff_fair.models import model_fns

_DIGITS = digits.load_digits()
_SPECS = {name: model_fns.build_model_spec(
    name, x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(), num_classes=10)
          for name in ('lenet', 'ditto_cnn')}
# Clients hold the first 600 digits; the server the rest.
_PUBLIC = slice(1000, 1400)
_VALIDATION = slice(1400, 1600)


def _dataset(client: int, size: int = 100) -> tf.data.Dataset:
  rows = slice(client * size, (client + 1) * size)
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=_DIGITS.x[rows], y=_DIGITS.y[rows])).batch(20)


def _validation():
  return _DIGITS.x[_VALIDATION], _DIGITS.y[_VALIDATION]


def _one_hot_logits(labels: np.ndarray) -> np.ndarray:
  """Logits a confident teacher of these labels would give."""
  return (8.0 * np.eye(10, dtype=np.float32)[labels]).astype(np.float32)


def _flat(weights) -> list[np.ndarray]:
  return [np.asarray(w) for w in tf.nest.flatten(weights)]


class LossesTest(tf.test.TestCase):

  def test_kl_divergence_is_zero_only_at_the_teacher(self):
    teacher = tf.constant([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    self.assertAllClose(distillation.kl_divergence(teacher, teacher), 0.0,
                        atol=1e-6)
    # Softmax ignores a shift of the logits.
    self.assertAllClose(distillation.kl_divergence(teacher, teacher + 5.0),
                        0.0, atol=1e-6)
    self.assertGreater(
        distillation.kl_divergence(teacher, tf.reverse(teacher, [1])), 0.5)
    self.assertAllClose(
        distillation.mean_absolute_error(teacher, teacher + 1.0), 1.0)


class DistillTest(tf.test.TestCase):
  """`feddf.distill` eagerly, at the server."""

  def _distill(self, start, teacher, **options):
    spec = _SPECS['lenet']
    settings = dict(optimizer=tff.learning.optimizers.build_adam(1e-3),
                    steps=300, validate_every=25, patience=100,
                    batch_size=32, seed=(7, 0))
    settings.update(options)
    return feddf.distill(spec.model_fn, start, teacher,
                         _DIGITS.x[_PUBLIC], _validation(), **settings)

  def _kl(self, weights, teacher):
    logits = distillation.Logits(_SPECS['lenet'].model_fn)(
        weights, _DIGITS.x[_PUBLIC])
    return float(distillation.kl_divergence(teacher, logits))

  def test_the_fitting_loop_lowers_the_kl_to_the_teacher(self):
    start = _SPECS['lenet'].initial_weights(0)
    # A soft teacher (the labels' one-hot logits, tempered), fitted by the
    # loop itself: no validation picks a step here.
    teacher = 0.5 * _one_hot_logits(_DIGITS.y[_PUBLIC])
    before = self._kl(start, teacher)
    model = _SPECS['lenet'].model_fn()
    fit = distillation.build_fitting_loop(
        model, tff.learning.optimizers.build_adam(1e-3),
        distillation.kl_divergence)
    data = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=_DIGITS.x[_PUBLIC], logits=teacher)).shuffle(400, seed=1).batch(32)
    losses, weights, state = [], start, None
    for _ in range(8):
      result = fit(weights, data, state)
      weights, state = result['weights'], result['optimizer_state']
      losses.append(float(result['loss']))
    after = self._kl(weights, teacher)
    self.assertLess(after, 0.5 * before, (before, after))
    # The optimizer's state carries over: the epochs' mean loss falls.
    self.assertLess(losses[-1], losses[0])
    self.assertLess(losses[-1], losses[len(losses) // 2])

  def test_a_teacher_that_helps_is_followed_to_its_best_step(self):
    start = _SPECS['lenet'].initial_weights(0)
    teacher = _one_hot_logits(_DIGITS.y[_PUBLIC])  # Right labels.
    fitted, report = self._distill(start, teacher)
    self.assertGreater(report['best_step'], 0)
    self.assertGreater(report['validation_accuracy'],
                       report['validation_accuracy_before'] + 0.2)
    self.assertEqual(report['best_step'] % 25, 0)
    # The kept weights are those after `best_step` steps: a run that stops
    # there (the same seeded batches) ends with the same bytes.
    replay, replay_report = self._distill(
        start, teacher, steps=report['best_step'],
        validate_every=report['best_step'])
    self.assertEqual(replay_report['steps'], report['best_step'])
    for a, b in zip(_flat(fitted), _flat(replay)):
      self.assertEqual(a.tobytes(), b.tobytes())

  def test_early_stopping_restores_the_best_validation_weights(self):
    # A start that already knows some digits, and a teacher of wrong labels
    # (each digit called the next one): every step makes it worse on the
    # validation set, so patience stops it and the start comes back.
    start = _SPECS['lenet'].initial_weights(0)
    start, _ = self._distill(start, _one_hot_logits(_DIGITS.y[_PUBLIC]),
                             steps=100, validate_every=100)
    wrong = _one_hot_logits((_DIGITS.y[_PUBLIC] + 1) % 10)
    fitted, report = self._distill(start, wrong, steps=1000,
                                   validate_every=25, patience=100)
    self.assertEqual(report['best_step'], 0)
    self.assertEqual(report['steps'], 100)  # Stopped early, not at 1000.
    self.assertGreater(report['validation_accuracy_before'], 0.4)
    self.assertEqual(report['validation_accuracy'],
                     report['validation_accuracy_before'])
    for a, b in zip(_flat(fitted), _flat(start)):
      self.assertEqual(a.tobytes(), b.tobytes())

  def test_zero_steps_keep_the_start(self):
    start = _SPECS['lenet'].initial_weights(0)
    fitted, report = self._distill(start, _one_hot_logits(
        _DIGITS.y[_PUBLIC]), steps=0)
    self.assertEqual((report['steps'], report['best_step']), (0, 0))
    for a, b in zip(_flat(fitted), _flat(start)):
      self.assertEqual(a.tobytes(), b.tobytes())


class FedDFProcessTest(tff_test_utils.TffTestCase):

  def _build(self, **options):
    settings = dict(public_x=_DIGITS.x[_PUBLIC], validation=_validation(),
                    distillation_steps=100, validate_every=25, patience=50)
    settings.update(options)
    return feddf.build_feddf(
        {name: spec.model_fn for name, spec in _SPECS.items()},
        digits_clients.sgd(0.1), **settings)

  def _start(self, process):
    return process.set_model_weights(process.initialize(), {
        name: spec.initial_weights(0) for name, spec in _SPECS.items()})

  def test_without_distillation_each_architecture_is_tffs_fedavg(self):
    process = self._build(distillation_steps=0)
    state = self._start(process)
    fedavg = tff.learning.algorithms.build_weighted_fed_avg(
        _SPECS['lenet'].model_fn, client_optimizer_fn=digits_clients.sgd(0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
    reference = fedavg.set_model_weights(fedavg.initialize(),
                                         _SPECS['lenet'].initial_weights(0))
    # Plain data sets, as TFF's FedAvg takes them; no ditto_cnn client.
    output = process.next(state, {'lenet': [_dataset(0), _dataset(1)]})
    expected = fedavg.next(reference, [_dataset(0), _dataset(1)]).state
    weights = process.get_model_weights(output.state)
    self.assertAllClose(weights['lenet'].trainable,
                        expected.global_model_weights.trainable, atol=1e-5)
    # An architecture no client trained keeps its model.
    for a, b in zip(_flat(weights['ditto_cnn']),
                    _flat(_SPECS['ditto_cnn'].initial_weights(0))):
      self.assertEqual(a.tobytes(), b.tobytes())
    self.assertEqual(output.metrics['ensemble']['size'], 2)
    self.assertEqual(output.metrics['lenet']['distillation']['steps'], 0)

  def test_a_round_of_two_architectures_distils_into_both(self):
    process = self._build()
    state = self._start(process)
    before = process.get_model_weights(state)
    output = process.next(state, {'lenet': [_dataset(0), _dataset(1)],
                                  'ditto_cnn': [_dataset(2), _dataset(3)]})
    metrics = output.metrics
    self.assertEqual(metrics['ensemble']['size'], 4)
    self.assertBetween(metrics['ensemble']['validation_accuracy'], 0.0, 1.0)
    after = process.get_model_weights(output.state)
    for name in _SPECS:
      report = metrics[name]['distillation']
      self.assertGreater(report['steps'], 0)
      self.assertGreaterEqual(report['validation_accuracy'],
                              report['validation_accuracy_before'])
      self.assertNotAllClose(_flat(after[name])[0], _flat(before[name])[0])
    self.assertEqual(metrics['client_work']['train']['num_examples'], 400)
    # The same round again gives the same models, to the byte.
    again = process.next(state, {'lenet': [_dataset(0), _dataset(1)],
                                 'ditto_cnn': [_dataset(2), _dataset(3)]})
    for a, b in zip(_flat(process.get_model_weights(again.state)),
                    _flat(after)):
      self.assertEqual(a.tobytes(), b.tobytes())

  def test_bad_arguments_are_refused(self):
    for options, message in (
        (dict(public_x=_DIGITS.x[:0]), 'non-empty public set'),
        (dict(validation=(_DIGITS.x[:3], _DIGITS.y[:2])), 'validation must'),
        (dict(patience=0), 'patience must be an int >= 1'),
        (dict(distillation_steps=-1), 'distillation_steps must be'),
    ):
      with self.subTest(options), self.assertRaisesRegex(ValueError,
                                                         message):
        self._build(**options)
    process = self._build()
    with self.assertRaisesRegex(ValueError, 'Unknown architecture'):
      process.next(process.initialize(), {'cnn': [_dataset(0)]})


if __name__ == '__main__':
  tf.test.main()
