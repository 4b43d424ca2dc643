"""Tests for tff_fair.data.federated.

Most tests use scikit-learn's bundled digits (offline, 1,797 examples). The
natural-partition tests of the real FEMNIST and Shakespeare files read them
from `TFF_FAIR_DATA_DIR` and are skipped, by name, where they are absent
(tests/real_data.py); the same paths run on small sources built here.
Nothing here executes a federated computation, so no TFF worker process is
started.
"""

import collections
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import real_data
from tff_fair.data import federated
from tff_fair.data import partition as partition_lib
from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib

_DIGITS = registry.load_source('digits')


def _build(**kwargs):
  defaults = dict(partition='homogeneous', num_clients=8, seed=0)
  defaults.update(kwargs)
  return federated.build_federated_data(_DIGITS, **defaults)


def _total(data) -> int:
  return sum(
      data.num_examples(c, s) for c in data.client_ids for s in federated.SPLITS
  )


def _sequence_source(n=40, length=5):
  """A tiny Shakespeare-like source with (N, length) targets and groups."""
  x = np.arange(n * length, dtype=np.int32).reshape(n, length) % 90
  return source_lib.Source(
      name='toy_sequences',
      x=x,
      y=(x + 1) % 90,
      num_classes=90,
      is_test=np.arange(n) % 5 == 0,
      groups=np.arange(n) % 4,
      group_names=('a', 'b', 'c', 'd'),
  )


class SplitTest(parameterized.TestCase):

  @parameterized.parameters(
      ('homogeneous', {}),
      ('dirichlet', {'alpha': 0.5}),
      ('quantity_skew', {'kappa': 0.5, 'm': 2}),
      ('label_skew', {'classes_per_client': 3}),
  )
  def test_splits_disjoint_within_pool_and_sized(self, partition, params):
    data = _build(partition=partition, **params)
    self.assertLen(data.client_ids, 8)
    self.assertEqual(data.client_ids[0], 'client_0000')
    seen = []
    for client_id in data.client_ids:
      splits = data.splits[client_id]
      pool = np.concatenate([splits.train, splits.validation, splits.test])
      self.assertLen(np.unique(pool), len(pool))  # Disjoint splits.
      n = len(pool)
      self.assertEqual(len(splits.test), int(np.floor(0.2 * n + 0.5)))
      self.assertEqual(len(splits.validation), int(np.floor(0.1 * n + 0.5)))
      self.assertGreater(len(splits.train), 0)
      seen.append(pool)
    seen = np.concatenate(seen)
    self.assertLen(np.unique(seen), len(seen))  # Clients disjoint.

  def test_splits_match_partition_pool(self):
    data = _build(partition='dirichlet', alpha=0.3, seed=5)
    pools = partition_lib.dirichlet(_DIGITS.y, 8, 0.3, seed=5)
    for client_id, pool in zip(data.client_ids, pools):
      splits = data.splits[client_id]
      joined = np.concatenate([splits.train, splits.validation, splits.test])
      np.testing.assert_array_equal(np.sort(joined), pool)

  def test_splits_are_stratified(self):
    data = _build(num_clients=2, validation_fraction=0.2, test_fraction=0.3)
    for client_id in data.client_ids:
      splits = data.splits[client_id]
      pool = np.concatenate([splits.train, splits.validation, splits.test])
      per_class = np.bincount(_DIGITS.y[pool], minlength=10)
      for split, fraction in (('test', 0.3), ('validation', 0.2)):
        counts = np.bincount(
            _DIGITS.y[splits.get(split)], minlength=10
        )
        self.assertLessEqual(
            float(np.abs(counts - fraction * per_class).max()), 1.0
        )

  def test_examples_per_client_caps_pool(self):
    data = _build(num_clients=4, examples_per_client=100)
    for client_id in data.client_ids:
      total = sum(data.num_examples(client_id, s) for s in federated.SPLITS)
      self.assertEqual(total, 100)
      self.assertEqual(data.num_examples(client_id, 'test'), 20)
      self.assertEqual(data.num_examples(client_id, 'validation'), 10)
      self.assertEqual(data.num_examples(client_id, 'train'), 70)

  def test_cap_larger_than_pool_keeps_pool(self):
    data = _build(num_clients=4, examples_per_client=10_000)
    self.assertEqual(_total(data), _DIGITS.num_examples)

  def test_deterministic_by_seed(self):
    first = _build(partition='dirichlet', alpha=0.5, seed=3)
    again = _build(partition='dirichlet', alpha=0.5, seed=3)
    other = _build(partition='dirichlet', alpha=0.5, seed=4)
    for client_id in first.client_ids:
      for split in federated.SPLITS:
        np.testing.assert_array_equal(
            first.indices(client_id, split), again.indices(client_id, split)
        )
    self.assertFalse(
        all(
            np.array_equal(first.indices(c, 'train'), other.indices(c, 'train'))
            for c in first.client_ids
        )
    )

  def test_arrays(self):
    data = _build()
    client_id = data.client_ids[2]
    x, y = data.arrays(client_id, 'validation')
    positions = data.indices(client_id, 'validation')
    np.testing.assert_array_equal(x, _DIGITS.x[positions])
    np.testing.assert_array_equal(y, _DIGITS.y[positions])
    self.assertEqual(x.shape[1:], (8, 8, 1))

  def test_partition_params_recorded(self):
    data = _build(partition='dirichlet', alpha=0.5)
    self.assertEqual(data.partition, 'dirichlet')
    self.assertEqual(data.partition_params['alpha'], 0.5)
    self.assertEqual(data.seed, 0)


class ServerHeldOutTest(parameterized.TestCase):

  @parameterized.parameters(
      ('homogeneous', {}),
      ('dirichlet', {'alpha': 0.5}),
      ('label_skew', {'classes_per_client': 3}),
  )
  def test_disjoint_sized_stratified_and_clients_unchanged(
      self, partition, params):
    without = _build(partition=partition, num_clients=4,
                     examples_per_client=100, **params)
    data = _build(partition=partition, num_clients=4, examples_per_client=100,
                  server_held_out_examples=300, **params)
    held = np.concatenate([data.indices(c, s) for c in data.client_ids
                           for s in federated.SPLITS])
    validation = data.server_splits['validation']
    test = data.server_splits['test']
    self.assertLen(validation, 300)
    self.assertLen(test, 300)
    self.assertEmpty(np.intersect1d(validation, test))
    self.assertEmpty(np.intersect1d(held, np.concatenate([validation, test])))
    for client_id in data.client_ids:
      for split in federated.SPLITS:
        np.testing.assert_array_equal(data.indices(client_id, split),
                                      without.indices(client_id, split))
    # Each set follows the class shares of the whole source, however skewed
    # the examples the clients leave are.
    shares = np.bincount(_DIGITS.y, minlength=10) / _DIGITS.num_examples
    for positions in (validation, test):
      counts = np.bincount(_DIGITS.y[positions], minlength=10)
      self.assertLessEqual(float(np.abs(counts - 300 * shares).max()), 1.5,
                           counts)
    x, y = data.server_arrays('test')
    np.testing.assert_array_equal(x, _DIGITS.x[test])
    np.testing.assert_array_equal(y, _DIGITS.y[test])
    self.assertEqual(data.partition_params['server_held_out_examples'], 300)
    self.assertIn('server', data.summary().splitlines()[-1])

  def test_deterministic_by_seed(self):
    first = _build(num_clients=4, examples_per_client=100,
                   server_held_out_examples=200, seed=3)
    again = _build(num_clients=4, examples_per_client=100,
                   server_held_out_examples=200, seed=3)
    other = _build(num_clients=4, examples_per_client=100,
                   server_held_out_examples=200, seed=4)
    for split in federated.SERVER_SPLITS:
      np.testing.assert_array_equal(first.server_splits[split],
                                    again.server_splits[split])
      self.assertFalse(np.array_equal(first.server_splits[split],
                                      other.server_splits[split]))

  def test_short_class_is_filled_from_the_others(self):
    # A client holds 95 of the 100 examples of class 0: the server gets the
    # 5 left and fills the rest of class 0's share with class 1.
    labels = np.repeat([0, 1], 100)
    client = federated.ClientSplits(
        train=np.arange(95), validation=np.zeros(0, np.int64),
        test=np.zeros(0, np.int64))
    sets = federated._server_splits(200, [client], labels, 20, seed=0)
    chosen = np.concatenate([sets['validation'], sets['test']])
    self.assertLen(sets['validation'], 20)
    self.assertLen(sets['test'], 20)
    self.assertLen(np.unique(chosen), 40)
    self.assertEmpty(np.intersect1d(chosen, np.arange(95)))
    self.assertContainsSubset(set(range(95, 100)), set(chosen.tolist()))

  def test_too_few_unheld_examples(self):
    # 4 clients x 400 hold 1,600 of 1,797 digits: 197 are left.
    with self.assertRaisesRegex(
        ValueError, r'needs 400 examples that no client holds, but only 197'):
      _build(num_clients=4, examples_per_client=400,
             server_held_out_examples=200)

  def test_bad_size_and_missing_sets(self):
    with self.assertRaisesRegex(ValueError, 'non-negative integer'):
      _build(server_held_out_examples=-1)
    data = _build(num_clients=4)
    self.assertFalse(data.has_server_held_out)
    with self.assertRaisesRegex(ValueError, '--server_held_out_examples'):
      data.server_arrays('test')
    with self.assertRaisesRegex(ValueError, 'Unknown server split'):
      data.server_arrays('train')


class PublicSetTest(absltest.TestCase):

  def test_disjoint_from_every_other_split_which_it_leaves_unchanged(self):
    without = _build(partition='dirichlet', alpha=0.5, num_clients=4,
                     examples_per_client=100, server_held_out_examples=200)
    data = _build(partition='dirichlet', alpha=0.5, num_clients=4,
                  examples_per_client=100, server_held_out_examples=200,
                  public_examples=300)
    self.assertLen(data.public, 300)
    held = np.concatenate(
        [data.indices(c, s) for c in data.client_ids for s in federated.SPLITS]
        + [data.server_splits[s] for s in federated.SERVER_SPLITS])
    self.assertEmpty(np.intersect1d(held, data.public))
    for client_id in data.client_ids:
      for split in federated.SPLITS:
        np.testing.assert_array_equal(data.indices(client_id, split),
                                      without.indices(client_id, split))
    for split in federated.SERVER_SPLITS:
      np.testing.assert_array_equal(data.server_splits[split],
                                    without.server_splits[split])
    shares = np.bincount(_DIGITS.y, minlength=10) / _DIGITS.num_examples
    counts = np.bincount(_DIGITS.y[data.public], minlength=10)
    self.assertLessEqual(float(np.abs(counts - 300 * shares).max()), 1.5)
    x, _ = data.public_arrays()
    np.testing.assert_array_equal(x, _DIGITS.x[data.public])
    self.assertEqual(data.partition_params['public_examples'], 300)

  def test_too_few_examples_and_none_asked(self):
    with self.assertRaisesRegex(ValueError, r'public_examples=300 needs 300'
                                r' examples .* only 197'):
      _build(num_clients=4, examples_per_client=400, public_examples=300)
    with self.assertRaisesRegex(ValueError, '--public_examples'):
      _build(num_clients=4).public_arrays()
    with self.assertRaisesRegex(ValueError, 'non-negative integer'):
      _build(public_examples=-1)


class RotationTest(absltest.TestCase):

  def test_chosen_clients_see_every_image_turned_and_nothing_else_changes(
      self):
    sets = dict(num_clients=8, examples_per_client=100,
                server_held_out_examples=100, public_examples=100)
    upright = _build(**sets)
    data = _build(**sets, rotated_client_fraction=0.5)
    self.assertLen(data.rotated_clients, 4)
    self.assertEqual(data.rotated_clients, _build(
        num_clients=8, rotated_client_fraction=0.5).rotated_clients)
    self.assertNotEqual(data.rotated_clients, _build(
        num_clients=8, seed=1, rotated_client_fraction=0.5).rotated_clients)
    for client_id in data.client_ids:
      for split in federated.SPLITS:
        np.testing.assert_array_equal(data.indices(client_id, split),
                                      upright.indices(client_id, split))
        x, y = data.arrays(client_id, split)
        x_upright, y_upright = upright.arrays(client_id, split)
        np.testing.assert_array_equal(y, y_upright)
        if client_id in data.rotated_clients:
          np.testing.assert_array_equal(x, x_upright[:, ::-1, ::-1])
          self.assertFalse(np.array_equal(x, x_upright))
        else:
          np.testing.assert_array_equal(x, x_upright)
    np.testing.assert_array_equal(data.public_arrays()[0],
                                  upright.public_arrays()[0])
    np.testing.assert_array_equal(data.server_arrays('test')[0],
                                  upright.server_arrays('test')[0])
    self.assertEqual(data.partition_params['rotated_client_fraction'], 0.5)
    self.assertEqual(data.summary().count('rotated 180 degrees'), 4)
    # One client at least, whatever the share.
    self.assertLen(_build(num_clients=8,
                          rotated_client_fraction=0.01).rotated_clients, 1)
    self.assertEqual(upright.rotated_clients, ())

  def test_bad_share_and_text_inputs_are_refused(self):
    for fraction in (-0.1, 1.0, float('nan')):
      with self.assertRaisesRegex(ValueError, r'in \[0, 1\)'):
        _build(rotated_client_fraction=fraction)
    tokens = source_lib.Source(np.zeros([40, 5], np.int32),
                               np.arange(40) % 2, 2, np.zeros(40, bool))
    with self.assertRaisesRegex(ValueError, 'rotates images.*use 0'):
      federated.build_federated_data(tokens, partition='homogeneous',
                                     num_clients=2, seed=0,
                                     rotated_client_fraction=0.5)


class NaturalTest(absltest.TestCase):

  def test_natural_keeps_source_test_split(self):
    source = _sequence_source()
    data = federated.build_federated_data(
        source, partition='natural', num_clients=None, seed=0,
        validation_fraction=0.25,
    )  # pyformat: disable
    self.assertEqual(data.client_ids, ('a', 'b', 'c', 'd'))
    for g, client_id in enumerate(data.client_ids):
      splits = data.splits[client_id]
      members = np.flatnonzero(source.groups == g)
      np.testing.assert_array_equal(
          splits.test, members[source.is_test[members]]
      )
      train_pool = members[~source.is_test[members]]
      self.assertEqual(
          len(splits.validation), int(np.floor(0.25 * len(train_pool) + 0.5))
      )
      np.testing.assert_array_equal(
          np.sort(np.concatenate([splits.train, splits.validation])),
          train_pool,
      )

  def test_natural_first_clients(self):
    data = federated.build_federated_data(
        _sequence_source(), partition='natural', num_clients=2, seed=0
    )
    self.assertEqual(data.client_ids, ('a', 'b'))

  def test_femnist_writers(self):
    source = registry.load_source(
        'femnist', real_data.data_dir_with('femnist/femnist_partial.npz'))
    data = federated.build_federated_data(
        source, partition='natural', num_clients=None, seed=0
    )
    self.assertLen(data.client_ids, 105)
    self.assertEqual(data.client_ids, source.group_names)
    total_test = sum(data.num_examples(c, 'test') for c in data.client_ids)
    self.assertEqual(total_test, 1685)
    self.assertEqual(_total(data), source.num_examples)

  def test_femnist_cap_keeps_test_share(self):
    source = registry.load_source(
        'femnist', real_data.data_dir_with('femnist/femnist_partial.npz'))
    data = federated.build_federated_data(
        source, partition='natural', num_clients=10, seed=0,
        examples_per_client=50,
    )  # pyformat: disable
    for client_id in data.client_ids:
      counts = [data.num_examples(client_id, s) for s in federated.SPLITS]
      self.assertEqual(sum(counts), 50)
      self.assertBetween(counts[2], 3, 8)  # ~10% test, as in the source.

  def test_shakespeare_client_data(self):
    source = registry.load_source(
        'shakespeare', real_data.data_dir_with(
            'shakespeare/shakespeare_train.h5',
            'shakespeare/shakespeare_test.h5'))
    data = federated.build_federated_data(
        source, partition='natural', num_clients=None, seed=0
    )
    self.assertLen(data.client_ids, 715)
    client_data = data.client_data('train', batch_size=4)
    spec = client_data.element_type_structure
    self.assertEqual(spec['x'], tf.TensorSpec([None, 80], tf.int32))
    self.assertEqual(spec['y'], tf.TensorSpec([None, 80], tf.int32))
    client_id = data.client_ids[0]
    batches = list(client_data.create_tf_dataset_for_client(client_id))
    self.assertEqual(
        sum(int(b['x'].shape[0]) for b in batches),
        data.num_examples(client_id, 'train'),
    )


class ClientDataTest(parameterized.TestCase):

  def test_unbatched_client_data(self):
    data = _build()
    client_data = data.client_data('test')
    self.assertIsInstance(client_data, tff.simulation.datasets.ClientData)
    self.assertEqual(client_data.client_ids, list(data.client_ids))
    self.assertEqual(
        client_data.element_type_structure,
        collections.OrderedDict(
            x=tf.TensorSpec([8, 8, 1], tf.float32),
            y=tf.TensorSpec([], tf.int32),
        ),
    )
    client_id = data.client_ids[5]
    elements = list(client_data.create_tf_dataset_for_client(client_id))
    self.assertLen(elements, data.num_examples(client_id, 'test'))
    x, y = data.arrays(client_id, 'test')
    np.testing.assert_array_equal(elements[0]['x'].numpy(), x[0])
    self.assertEqual(int(elements[-1]['y']), int(y[-1]))

  def test_batched_client_data(self):
    data = _build()
    client_data = data.client_data('train', batch_size=16)
    self.assertEqual(
        client_data.element_type_structure['x'],
        tf.TensorSpec([None, 8, 8, 1], tf.float32),
    )
    client_id = data.client_ids[1]
    sizes = [
        int(b['y'].shape[0])
        for b in client_data.create_tf_dataset_for_client(client_id)
    ]
    n = data.num_examples(client_id, 'train')
    self.assertEqual(sum(sizes), n)
    self.assertLen(sizes, -(-n // 16))

  def test_all_clients_dataset_through_traced_path(self):
    data = _build(num_clients=3)
    client_data = data.client_data('validation', batch_size=5)
    total = sum(
        int(b['y'].shape[0])
        for b in client_data.create_tf_dataset_from_all_clients(seed=0)
    )
    self.assertEqual(
        total, sum(data.num_examples(c, 'validation') for c in data.client_ids)
    )

  def test_traced_dataset_matches_eager(self):
    data = _build(num_clients=3)
    client_data = data.client_data('train')
    client_id = data.client_ids[1]

    @tf.function
    def first_label(cid):
      return next(iter(client_data.serializable_dataset_fn(cid)))['y']

    x, y = data.arrays(client_id, 'train')
    del x
    self.assertEqual(int(first_label(tf.constant(client_id))), int(y[0]))

  def test_lazy_per_client(self):
    data = _build(num_clients=6)
    with mock.patch.object(
        federated.FederatedData, 'dataset', autospec=True,
        side_effect=federated.FederatedData.dataset,
    ) as dataset:  # pyformat: disable
      client_data = data.client_data('train')
      # TFF builds the first client's dataset once to learn the element spec.
      self.assertEqual(dataset.call_count, 1)
      client_data.create_tf_dataset_for_client(data.client_ids[4])
      self.assertEqual(dataset.call_count, 2)
      self.assertEqual(dataset.call_args[0][1], data.client_ids[4])

  def test_dataset_unbatched(self):
    data = _build()
    client_id = data.client_ids[0]
    dataset = data.dataset(client_id, 'train')
    self.assertEqual(dataset.element_spec['y'], tf.TensorSpec([], tf.int32))
    self.assertEqual(
        int(dataset.cardinality()), data.num_examples(client_id, 'train')
    )

  def test_bad_split_and_batch_size(self):
    data = _build()
    with self.assertRaisesRegex(ValueError, "Unknown split 'dev'"):
      data.client_data('dev')
    with self.assertRaisesRegex(ValueError, 'batch_size must be'):
      data.client_data('train', batch_size=0)
    with self.assertRaisesRegex(ValueError, "Unknown client 'nobody'"):
      data.arrays('nobody', 'train')


class SummaryTest(absltest.TestCase):

  def test_summary_has_counts_and_histogram(self):
    data = _build(num_clients=3)
    text = data.summary()
    lines = text.splitlines()
    self.assertIn('source=digits partition=homogeneous', lines[0])
    self.assertIn('train classes', lines[1])
    for line, client_id in zip(lines[2:], data.client_ids):
      counts = [data.num_examples(client_id, s) for s in federated.SPLITS]
      self.assertEqual(line.split()[:4], [client_id] + [str(c) for c in counts])
      histogram = np.bincount(
          _DIGITS.y[data.indices(client_id, 'train')], minlength=10
      )
      self.assertIn(f'0:{histogram[0]} 1:{histogram[1]}', line)
    self.assertTrue(lines[-1].startswith('total'))
    self.assertEqual(
        lines[-1].split()[1],
        str(sum(data.num_examples(c, 'train') for c in data.client_ids)),
    )

  def test_summary_without_class_labels(self):
    data = federated.build_federated_data(
        _sequence_source(), partition='homogeneous', num_clients=2, seed=0
    )
    self.assertNotIn('classes', data.summary())


class ErrorTest(parameterized.TestCase):

  @parameterized.parameters(
      (-0.1, 0.2, 'validation_fraction must be in'),
      (0.1, 1.0, 'test_fraction must be in'),
      (0.5, 0.5, 'leaves no training data'),
  )
  def test_bad_fractions(self, validation, test, message):
    with self.assertRaisesRegex(ValueError, message):
      _build(validation_fraction=validation, test_fraction=test)

  def test_client_without_train_data(self):
    with self.assertRaisesRegex(
        ValueError,
        r'Client client_0000 has 2 examples and 1 go to test and 1 to'
        ' validation, which leaves no training example',
    ):
      _build(num_clients=4, examples_per_client=2, test_fraction=0.3,
             validation_fraction=0.3)  # pyformat: disable

  def test_natural_without_groups(self):
    with self.assertRaisesRegex(ValueError, 'has no natural groups'):
      _build(partition='natural')

  @parameterized.parameters(
      ('dirichlet', {'alpha': 0.5}),
      ('label_skew', {'classes_per_client': 2}),
  )
  def test_label_partition_on_sequences(self, partition, params):
    with self.assertRaisesRegex(ValueError, 'needs one class label'):
      federated.build_federated_data(
          _sequence_source(), partition=partition, num_clients=2, seed=0,
          **params,
      )  # pyformat: disable

  def test_unknown_partition(self):
    with self.assertRaisesRegex(ValueError, 'Unknown partition'):
      _build(partition='iid')

  def test_bad_cap(self):
    with self.assertRaisesRegex(ValueError, 'examples_per_client must be'):
      _build(examples_per_client=0)


if __name__ == '__main__':
  absltest.main()
