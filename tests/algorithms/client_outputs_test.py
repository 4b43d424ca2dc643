"""client_outputs.compose: TFF's four parts, plus what each client returns."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tests.algorithms import digits_clients
from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import training_loop
from tff_fair.models import model_fns

_SPEC = model_fns.build_model_spec(
    'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
    num_classes=10)
_CLIENTS = digits_clients.Clients((30, 50, 20), _SPEC.model_fn)


def _fed_avg_with_outputs(reward_fn=None):
  """FedAvg's parts; each client also returns its examples and update norm."""
  parts = fed_avg.build_fed_avg_parts(_SPEC.model_fn, digits_clients.sgd())
  weights_type = tff.learning.models.weights_type_from_model(_SPEC.model_fn)

  @tff.tensorflow.computation(weights_type,
                              training_loop.data_type_of(_SPEC.model_fn))
  def client_update(weights, data):
    trained = training_loop.build_training_loop(
        _SPEC.model_fn(), digits_clients.sgd())(weights, data)
    update, weight = fed_avg.update_and_weight(
        weights, trained, None, fed_avg.ClientWeighting.NUM_EXAMPLES)
    norm = tf.linalg.global_norm(tf.nest.flatten(update))
    return (tff.learning.templates.ClientResult(update, weight),
            trained['metrics'],
            collections.OrderedDict(num_examples=trained['num_examples'],
                                    norm=norm))

  return client_outputs.compose(
      parts.initial_model_weights_fn, parts.model_weights_distributor,
      client_outputs.build_client_work(
          client_update, fed_avg.metrics_aggregation(_SPEC.model_fn),
          summed_outputs=('num_examples',)),
      parts.model_update_aggregator, parts.model_finalizer,
      reward_fn=reward_fn)


class ComposeTest(tff_test_utils.TffTestCase):

  def test_same_round_as_tff_compose_plus_client_values(self):
    process = _fed_avg_with_outputs()
    reference = fed_avg.build_fed_avg(_SPEC.model_fn, digits_clients.sgd())
    data = [_CLIENTS.dataset(c) for c in range(3)]
    initial = _SPEC.initial_weights(0)
    state = process.set_model_weights(process.initialize(), initial)
    output = process.next_with_client_outputs(state, data)
    expected = reference.next(
        reference.set_model_weights(reference.initialize(), initial), data)
    self.assertAllClose(process.get_model_weights(output.state).trainable,
                        reference.get_model_weights(expected.state).trainable)
    self.assertAllClose(output.metrics['client_work']['train'],
                        expected.metrics['client_work']['train'])
    # Each client's values, in input order, and their released sum.
    self.assertEqual([int(c['num_examples']) for c in output.clients],
                     [30, 50, 20])
    self.assertEqual(output.metrics['client_work']['num_examples'], 100)
    for c, values in enumerate(output.clients):
      update = _CLIENTS.local_update(initial, c)
      self.assertAllClose(values['norm'], np.sqrt(sum(
          np.sum(u**2) for u in update)), rtol=1e-5)
    # `next` is the same round without them.
    plain = process.next(state, data)
    self.assertAllClose(process.get_model_weights(plain.state).trainable,
                        process.get_model_weights(output.state).trainable)
    self.assertNotIn('reward', output.metrics)

  def test_reward_fn_gives_the_clients_values_after_the_server_step(self):

    @tff.tensorflow.computation(
        tff.learning.models.weights_type_from_model(_SPEC.model_fn))
    def first_weight(weights):
      return tf.reshape(weights.trainable[0], [-1])[0]

    @tff.tensorflow.computation(np.float32, np.int64)
    def plus(value, num_examples):
      return value + tf.cast(num_examples, tf.float32)

    def reward_fn(state, client_data, work, aggregated, finalized):
      del client_data, aggregated
      # Each client receives the new server model's first weight plus its
      # examples; the server releases the old first weight.
      return (tff.federated_map(plus, (
          tff.federated_broadcast(
              tff.federated_map(first_weight, finalized.result)),
          work.result.outputs.num_examples)),
              tff.federated_map(first_weight, state.global_model_weights))

    process = _fed_avg_with_outputs(reward_fn)
    data = [_CLIENTS.dataset(c) for c in range(2)]
    state = process.initialize()
    output = process.next_with_client_outputs(state, data)
    new_first = np.ravel(
        process.get_model_weights(output.state).trainable[0])[0]
    self.assertAllClose(output.clients, [new_first + 30, new_first + 50])
    self.assertAllClose(
        output.metrics['reward'],
        np.ravel(process.get_model_weights(state).trainable[0])[0])
    self.assertNotAllClose(output.metrics['reward'], new_first)


if __name__ == '__main__':
  tf.test.main()
