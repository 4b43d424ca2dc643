"""FedMD's computations on real digits, against the rule computed eagerly."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tests.algorithms import digits_clients
from tff_fair.algorithms import distillation
from tff_fair.algorithms import fedmd
from tff_fair.algorithms import training_loop
from tff_fair.data.sources import digits
from tff_fair.models import model_fns

_DIGITS = digits.load_digits()
_SPECS = {name: model_fns.build_model_spec(
    name, x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(), num_classes=10)
          for name in ('lenet', 'ditto_cnn')}
# Clients hold the first 300 digits; the public set is further on.
_PUBLIC = slice(1000, 1200)
_ALIGNMENT = 120
_DIGEST = dict(digest_epochs=2, digest_batch_size=32)


def _dataset(client: int, size: int = 60) -> tf.data.Dataset:
  rows = slice(client * size, (client + 1) * size)
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=_DIGITS.x[rows], y=_DIGITS.y[rows])).batch(20)


def _flat(weights) -> list[np.ndarray]:
  return [np.asarray(w) for w in tf.nest.flatten(weights)]


def _build(**options):
  settings = dict(public_x=_DIGITS.x[_PUBLIC], alignment_examples=_ALIGNMENT,
                  seed=5, **_DIGEST)
  settings.update(options)
  return fedmd.build_fedmd({n: s.model_fn for n, s in _SPECS.items()},
                           digits_clients.sgd(0.1), **settings)


class FedMDTest(tff_test_utils.TffTestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.process = _build()

  def _clients(self):
    """Two LeNet clients (different models) and one ditto_cnn client."""
    return {'lenet': [
        fedmd.client_input(_dataset(0), _SPECS['lenet'].initial_weights(0)),
        fedmd.client_input(_dataset(1), _SPECS['lenet'].initial_weights(1))],
            'ditto_cnn': [fedmd.client_input(
                _dataset(2), _SPECS['ditto_cnn'].initial_weights(0))]}

  def _eager_consensus(self, clients, x):
    """The mean over every client of its logits on x, in plain TF."""
    logits = [distillation.Logits(_SPECS[name].model_fn)(c['model'], x)
              for name, inputs in clients.items() for c in inputs]
    return np.mean(logits, axis=0)

  def test_consensus_is_the_mean_of_the_clients_logits(self):
    clients = self._clients()
    x = _DIGITS.x[_PUBLIC][self.process.alignment_rows(1)]
    lenet = clients['lenet']
    mean = self.process.consensus['lenet']([c['model'] for c in lenet], x)
    self.assertEqual(mean.shape, (_ALIGNMENT, 10))
    self.assertAllClose(mean, self._eager_consensus({'lenet': lenet}, x),
                        atol=1e-5)

  def test_a_round_digests_the_consensus_of_every_client_then_revisits(self):
    clients = self._clients()
    state = self.process.set_model_weights(self.process.initialize(), {
        name: spec.initial_weights(0) for name, spec in _SPECS.items()})
    output = self.process.next_with_client_outputs(state, clients)

    # The rule, eagerly: the consensus over all three clients (both
    # architectures) on round 1's alignment rows; LeNet client 1 fits it
    # with the MAE and Adam, in the rows' order, then trains on its data.
    x = _DIGITS.x[_PUBLIC][self.process.alignment_rows(1)]
    consensus = self._eager_consensus(clients, x).astype(np.float32)
    model = _SPECS['lenet'].model_fn()
    digested = distillation.build_fitting_loop(
        model, tff.learning.optimizers.build_adam(1e-3),
        distillation.mean_absolute_error)(
            clients['lenet'][1]['model'],
            tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
                x=x, logits=consensus)).batch(32).repeat(2))
    trained = training_loop.build_training_loop(
        model, digits_clients.sgd(0.1))(digested['weights'], _dataset(1))
    received = output.clients['lenet'][1]
    self.assertAllClose(received['model'].trainable,
                        trained['weights'].trainable, atol=1e-4)
    self.assertAllClose(received['digest_loss'], digested['loss'],
                        atol=1e-5)
    # The digest moved the model: without it the revisit ends elsewhere.
    undigested = training_loop.build_training_loop(
        model, digits_clients.sgd(0.1))(clients['lenet'][1]['model'],
                                         _dataset(1))
    self.assertNotAllClose(received['model'].trainable[0],
                           undigested['weights'].trainable[0], atol=1e-4)

    metrics = output.metrics
    self.assertEqual(dict(metrics['consensus']),
                     {'size': 3, 'examples': _ALIGNMENT})
    self.assertEqual(metrics['lenet']['clients'], 2)
    self.assertEqual(metrics['client_work']['train']['num_examples'], 180)
    self.assertLen(output.clients['ditto_cnn'], 1)
    self.assertEqual(int(output.state['round']), 1)
    # No model moves at the server: the start models stay.
    for a, b in zip(_flat(self.process.get_model_weights(output.state)),
                    _flat(self.process.get_model_weights(state))):
      self.assertEqual(a.tobytes(), b.tobytes())
    # The same round again gives the same models, to the byte.
    again = self.process.next_with_client_outputs(state, clients)
    for a, b in zip(_flat([c['model'] for c in again.clients['lenet']]),
                    _flat([c['model'] for c in output.clients['lenet']])):
      self.assertEqual(a.tobytes(), b.tobytes())

  def test_an_architecture_without_clients_is_left_out(self):
    clients = {'ditto_cnn': self._clients()['ditto_cnn']}
    output = self.process.next_with_client_outputs(
        self.process.initialize(), clients)
    self.assertCountEqual(output.clients, ['ditto_cnn'])
    self.assertEqual(output.metrics['lenet']['clients'], 0)
    self.assertTrue(np.isnan(output.metrics['lenet']['digest_loss']))
    self.assertEqual(output.metrics['consensus']['size'], 1)

  def test_each_round_aligns_on_a_fresh_seeded_subset(self):
    rows = [self.process.alignment_rows(r) for r in (1, 2)]
    for r in rows:
      self.assertLen(r, _ALIGNMENT)
      self.assertLen(set(r), _ALIGNMENT)
      self.assertTrue(np.all((r >= 0) & (r < 200)))
    self.assertNotEqual(list(rows[0]), list(rows[1]))
    self.assertEqual(list(self.process.alignment_rows(1)), list(rows[0]))

  def test_pretraining_learns_the_labeled_public_set_repeatably(self):
    public_x, public_y = _DIGITS.x[_PUBLIC], _DIGITS.y[_PUBLIC]
    process = _build(alignment_examples=0, public_y=public_y,
                     pretrain_epochs=30, pretrain_batch_size=20)
    start = {'lenet': _SPECS['lenet'].initial_weights(0)}
    pretrained = process.pretrain(start)['lenet']
    logits = distillation.Logits(_SPECS['lenet'].model_fn)

    def accuracy(weights):
      return np.mean(logits(weights, public_x).argmax(-1) == public_y)

    self.assertGreater(accuracy(pretrained), accuracy(start['lenet']) + 0.3)
    again = process.pretrain(start)['lenet']
    for a, b in zip(_flat(pretrained), _flat(again)):
      self.assertEqual(a.tobytes(), b.tobytes())
    # Without pretraining the weights pass through unchanged.
    for a, b in zip(_flat(self.process.pretrain(start)['lenet']),
                    _flat(start['lenet'])):
      self.assertEqual(a.tobytes(), b.tobytes())

  def test_bad_arguments_are_refused(self):
    for options, message in (
        (dict(public_x=_DIGITS.x[:0]), 'non-empty public set'),
        (dict(alignment_examples=201), 'more than the 200 public examples'),
        (dict(digest_epochs=0), 'digest_epochs must be an int >= 1'),
        (dict(pretrain_epochs=2), 'give public_y'),
    ):
      with self.subTest(options), self.assertRaisesRegex(ValueError,
                                                         message):
        _build(**options)
    with self.assertRaisesRegex(ValueError, 'Unknown architecture'):
      self.process.next_with_client_outputs(
          self.process.initialize(), {'cnn': []})


if __name__ == '__main__':
  tf.test.main()
