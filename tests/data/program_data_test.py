"""The data source `train_model` can deep-copy."""

import copy
import random

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.data import program_data


def _datasets():
  return [tf.data.Dataset.from_tensor_slices(
      np.arange(i, i + 3, dtype=np.int32)) for i in range(0, 12, 3)]


class DatasetDataSourceTest(tf.test.TestCase):

  def test_tff_s_own_iterator_cannot_be_deep_copied(self):
    # The reason for this module: if TFF fixes it, the module can go.
    with self.assertRaises(Exception):
      copy.deepcopy(tff.program.DatasetDataSource(_datasets()).iterator())

  def test_deep_copy_selects_the_same_clients_as_the_original(self):
    source = program_data.DatasetDataSource(_datasets())
    self.assertEqual(source.federated_type,
                     tff.program.DatasetDataSource(_datasets()).federated_type)
    iterator = source.iterator()
    copied = copy.deepcopy(iterator)
    self.assertIsInstance(copied, program_data.DatasetDataSourceIterator)
    self.assertEqual(copied.federated_type, iterator.federated_type)
    # TFF's iterator draws clients with Python's global generator.
    random.seed(0)
    original = [list(ds.as_numpy_iterator()) for ds in iterator.select(2)]
    random.seed(0)
    again = [list(ds.as_numpy_iterator()) for ds in copied.select(2)]
    self.assertEqual(original, again)
    self.assertLen(original, 2)


if __name__ == '__main__':
  tf.test.main()
