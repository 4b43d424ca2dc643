"""Tests for tff_fair.data.sources.femnist.

`RealFilesTest` reads `TFF_FAIR_DATA_DIR` and is skipped, by name, where
the file is absent (see tests/real_data.py).
"""

import os

from absl.testing import absltest
import numpy as np

from tests import real_data
from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib

_FEMNIST_FILE = 'femnist/femnist_partial.npz'


class RealFilesTest(absltest.TestCase):
  """Loaders on the real offline files; facts from the data README."""

  def test_femnist(self):
    source = registry.load_source('femnist',
                                  real_data.data_dir_with(_FEMNIST_FILE))
    self.assertEqual(source.x.shape, (14708 + 1685, 28, 28, 1))
    self.assertEqual(int(source.is_test.sum()), 1685)
    self.assertEqual(source.num_classes, 62)
    self.assertLen(source.group_names, 105)
    self.assertEqual(source.group_names[0][0], 'f')
    train_y = source.y[~source.is_test]
    test_y = source.y[source.is_test]
    self.assertLen(np.unique(train_y), 62)
    self.assertLen(np.unique(test_y), 62)
    # README: 10,596 digits, 2,047 upper- and 2,065 lower-case in train.
    self.assertEqual(int((train_y < 10).sum()), 10596)
    self.assertEqual(int(((train_y >= 10) & (train_y < 36)).sum()), 2047)
    self.assertEqual(int((train_y >= 36).sum()), 2065)
    # Every writer has train and test samples.
    for split in (False, True):
      self.assertLen(np.unique(source.groups[source.is_test == split]), 105)
    self.assertAlmostEqual(
        float(source.x[~source.is_test].mean(dtype=np.float64)) * 255,
        9.90,
        places=2,
    )

  def test_max_examples_keeps_every_writer(self):
    source = registry.load_source(
        'femnist', real_data.data_dir_with(_FEMNIST_FILE), max_examples=420)
    self.assertEqual(source.num_examples, 420)
    # 2 per (split, writer) strata round-robin: every writer in both splits.
    for split in (False, True):
      self.assertLen(np.unique(source.groups[source.is_test == split]), 105)


class FakeFilesTest(absltest.TestCase):
  """The loader on small files written here in the real formats."""

  def test_femnist_npz(self):
    root = self.create_tempdir()
    root.mkdir('femnist')
    x_train = np.zeros((5, 28, 28), np.uint8)
    x_train[2, 3, 4] = 255
    np.savez(
        os.path.join(root.full_path, 'femnist', 'femnist_partial.npz'),
        x_train=x_train, y_train=np.array([0, 61, 10, 36, 9], np.int16),
        writer_train=np.array([0, 0, 1, 1, 1], np.int32),
        x_test=np.zeros((2, 28, 28), np.uint8),
        y_test=np.array([5, 35], np.int16),
        writer_test=np.array([1, 0], np.int32),
        writer_names=np.array(['f0001_01', 'f0002_02']),
    )  # pyformat: disable
    source = registry.load_source('femnist', root.full_path)
    self.assertEqual(source.x.shape, (7, 28, 28, 1))
    self.assertEqual(source.num_classes, 62)
    np.testing.assert_array_equal(source.y, [0, 61, 10, 36, 9, 5, 35])
    np.testing.assert_array_equal(source.groups, [0, 0, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(source.is_test, [False] * 5 + [True] * 2)
    self.assertEqual(source.group_names, ('f0001_01', 'f0002_02'))
    self.assertEqual(float(source.x[2, 3, 4, 0]), 1.0)
    self.assertEqual(float(source.x.sum()), 1.0)

  def test_femnist_missing_arrays(self):
    root = self.create_tempdir()
    root.mkdir('femnist')
    np.savez(
        os.path.join(root.full_path, 'femnist', 'femnist_partial.npz'),
        x_train=np.zeros((1, 28, 28), np.uint8),
    )
    with self.assertRaisesRegex(
        source_lib.DataError, r'lacks the arrays .*y_train'
    ):
      registry.load_source('femnist', root.full_path)


if __name__ == '__main__':
  absltest.main()
