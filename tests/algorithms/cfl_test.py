"""Clustered FL's TFF process on real digits: plain data, clusters, placement."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tests.algorithms import digits_clients
from tff_fair.algorithms import cfl
from tff_fair.algorithms import clustering
from tff_fair.algorithms import update_attacks
from tff_fair.data.sources import digits
from tff_fair.models import model_fns

_SPEC = model_fns.build_model_spec(
    'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
    num_classes=10)
_DIGITS = digits.load_digits()
_SIZE = 100  # Examples per client: 10 batches of 10.
# Clients 1, 4 and 5 see their digits upside down (rotated 180 degrees):
# a group that is not contiguous in the client order.
_ROTATED = (1, 4, 5)
_NUM_CLIENTS = 7


def _dataset(client: int) -> tf.data.Dataset:
  rows = slice(client * _SIZE, (client + 1) * _SIZE)
  x = _DIGITS.x[rows]
  if client in _ROTATED:
    x = np.rot90(x, 2, axes=(1, 2))
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=x, y=_DIGITS.y[rows])).batch(10)


def _context_inputs(clients, round_num):
  return [cfl.client_input(_dataset(c), update_attacks.no_attack(
      seed=round_num, client_index=c)) for c in clients]


class CflProcessTest(tff_test_utils.TffTestCase):

  def test_plain_data_sets_drive_it_as_fedavg(self):
    process = cfl.build_cfl(_SPEC.model_fn, digits_clients.sgd(0.1),
                            num_clients=_NUM_CLIENTS, max_clusters=3)
    state_type, data_type = process.next.type_signature.parameter
    self.assertEqual(state_type.placement, tff.SERVER)
    self.assertEqual(data_type.placement, tff.CLIENTS)
    self.assertIsInstance(data_type.member, tff.SequenceType)
    # The same round as TFF's FedAvg (plain SGD at 1 on the server): no
    # client can be told apart, so every client trains the root model.
    fedavg = tff.learning.algorithms.build_weighted_fed_avg(
        _SPEC.model_fn, client_optimizer_fn=digits_clients.sgd(0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
    start = _SPEC.initial_weights(0)
    state = process.set_model_weights(process.initialize(), start)
    reference = fedavg.set_model_weights(fedavg.initialize(), start)
    datasets = [_dataset(c) for c in range(4)]
    for _ in range(2):
      output = process.next(state, datasets)
      state = output.state
      reference = fedavg.next(reference, datasets).state
    self.assertEqual(
        output.metrics['client_work']['train']['num_examples'], 4 * _SIZE)
    for ours, theirs in zip(process.get_model_weights(state).trainable,
                            fedavg.get_model_weights(reference).trainable):
      self.assertAllClose(ours, theirs, atol=1e-6)
    # Nothing to cluster by: the server's decisions are refused.
    plain = process.next_with_client_outputs(state, datasets)
    self.assertEqual({int(c['index']) for c in plain.clients}, {cfl.NO_INDEX})
    with self.assertRaisesRegex(ValueError, 'client_context=True'):
      cfl.split_and_place(plain.state, plain.clients,
                          clustering.SplitRule(10.0, 0.0, 0))

  def test_rotated_clients_split_off_and_a_late_client_is_placed(self):
    process = cfl.build_cfl(_SPEC.model_fn, digits_clients.sgd(0.1),
                            num_clients=_NUM_CLIENTS, max_clusters=2,
                            client_context=True)
    state = process.set_model_weights(process.initialize(),
                                      _SPEC.initial_weights(0))
    # Split whenever allowed after round 2; client 6 (upright) is not
    # sampled before the split.
    rule = clustering.SplitRule(eps1=100.0, eps2=0.0, warmup_rounds=2)
    sampled = [0, 1, 2, 3, 4, 5]
    for round_num in (1, 2, 3):
      output, decisions = cfl.next_with_splits(
          process, state, _context_inputs(sampled, round_num), rule)
      state = output.state
      self.assertEqual([int(c['index']) for c in output.clients], sampled)
      if round_num < 3:
        self.assertEqual(decisions.splits, ())
    (split,) = decisions.splits
    self.assertEqual((split.cluster, split.children), (0, (1, 2)))
    # The rotated group is one cluster, the upright clients the other.
    self.assertEqual(split.groups, ((0, 2, 3), (1, 4, 5)))
    self.assertEqual(cfl.clusters(state), [1, 2])
    self.assertEqual(cfl.cluster_members(state),
                     {0: [6], 1: [0, 2, 3], 2: [1, 4, 5]})
    # Both start from the root's model after the split round.
    root = cfl.slot_weights(state, 0)
    for child in (1, 2):
      for a, b in zip(cfl.slot_weights(state, child).trainable,
                      root.trainable):
        self.assertAllEqual(a, b)

    # Round 4: each cluster trains its own model; client 6 trains from the
    # root model (its slot) only to be placed, and joins the upright one.
    output, decisions = cfl.next_with_splits(
        process, state, _context_inputs([0, 1, 2, 3, 4, 5, 6], 4), rule)
    new = output.state
    self.assertEqual(decisions.placed, {6: 1})
    self.assertEqual(decisions.splits, ())  # No free slots are left.
    self.assertEqual(
        [int(c['slot']) for c in output.clients], [1, 2, 1, 1, 2, 2, 0])
    self.assertEqual([bool(c['leaf']) for c in output.clients],
                     [True] * 6 + [False])
    # The root is kept as it was; each cluster moved by its members' mean.
    for a, b in zip(cfl.slot_weights(new, 0).trainable, root.trainable):
      self.assertAllEqual(a, b)
    for slot, members in ((1, (0, 2, 3)), (2, (1, 4, 5))):
      updates = [output.clients[i]['update'] for i in members]
      weights = [float(output.clients[i]['weight']) for i in members]
      for layer, (moved, before) in enumerate(zip(
          cfl.slot_weights(new, slot).trainable,
          cfl.slot_weights(state, slot).trainable)):
        mean = np.average([u[layer] for u in updates], axis=0,
                          weights=weights)
        self.assertAllClose(moved, before - mean, atol=1e-6)
    self.assertNotAllClose(cfl.slot_weights(new, 1).trainable[0],
                           cfl.slot_weights(new, 2).trainable[0])
    client_model = cfl.client_weights(new)
    self.assertAllEqual(client_model(6).trainable[0],
                        cfl.slot_weights(new, 1).trainable[0])

  def test_bad_arguments(self):
    for kwargs, message in ((dict(num_clients=0), 'num_clients'),
                            (dict(max_clusters=0), 'max_clusters'),
                            (dict(server_learning_rate=float('nan')),
                             'server_learning_rate')):
      with self.subTest(kwargs), self.assertRaisesRegex(ValueError, message):
        cfl.build_cfl(_SPEC.model_fn, digits_clients.sgd(),
                      **{'num_clients': 3, **kwargs})


if __name__ == '__main__':
  tf.test.main()
