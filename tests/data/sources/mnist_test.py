"""Tests for tff_fair.data.sources.mnist (and its idx files' errors).

`RealFilesTest` reads `TFF_FAIR_DATA_DIR` and is skipped, by name, where
the file is absent (see tests/real_data.py).
"""

import gzip
import os

from absl.testing import absltest
import numpy as np

from tests import real_data
from tests.data.sources import fake_files
from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib

_MNIST_FILES = ('mnist/t10k-images-idx3-ubyte.gz',
                'mnist/t10k-labels-idx1-ubyte.gz')


class RealFilesTest(absltest.TestCase):
  """Loaders on the real offline files; facts from the data README."""

  def test_mnist_test_set(self):
    source = registry.load_source('mnist',
                                  real_data.data_dir_with(*_MNIST_FILES))
    self.assertEqual(source.x.shape, (10000, 28, 28, 1))
    self.assertTrue(source.is_test.all())  # Only the t10k files exist.
    np.testing.assert_array_equal(
        source.y[:10], [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    )
    np.testing.assert_array_equal(
        np.bincount(source.y),
        [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009],
    )
    self.assertAlmostEqual(float(source.x.mean(dtype=np.float64)), 0.1325, 4)


class FakeFilesTest(absltest.TestCase):
  """The loader on small files written here in the real formats."""

  def test_mnist_test_files_only(self):
    root = self.create_tempdir().full_path
    fake_files.write_fake_idx_set(os.path.join(root, 'mnist'),
                                  splits=('t10k',), n=5)
    source = registry.load_source('mnist', root)
    self.assertEqual(source.x.shape, (5, 28, 28, 1))
    self.assertTrue(source.is_test.all())
    np.testing.assert_array_equal(source.y, [0, 1, 2, 3, 4])

  def _mnist_copy(self) -> tuple[str, str]:
    """Temp data dir with mnist/ holding tiny valid t10k files."""
    root = self.create_tempdir().full_path
    directory = os.path.join(root, 'mnist')
    fake_files.write_fake_idx_set(directory, splits=('t10k',))
    return root, directory

  def test_truncated_gzip(self):
    root, directory = self._mnist_copy()
    labels = os.path.join(directory, 't10k-labels-idx1-ubyte.gz')
    with open(labels, 'rb') as f:
      payload = f.read()
    with open(labels, 'wb') as f:
      f.write(payload[: len(payload) // 2])
    with self.assertRaisesRegex(
        source_lib.DataError,
        r'Could not decompress .*t10k-labels-idx1-ubyte.gz.*corrupt or'
        ' truncated',
    ):
      registry.load_source('mnist', root)

  def test_idx_payload_shorter_than_header(self):
    root, directory = self._mnist_copy()
    path = os.path.join(directory, 't10k-images-idx3-ubyte.gz')
    with gzip.open(path, 'rb') as f:
      raw = f.read()
    fake_files.write_gz(path, raw[:-100])
    with self.assertRaisesRegex(
        source_lib.DataError,
        r't10k-images-idx3-ubyte.gz holds \d+ bytes but its IDX header'
        r' \(6, 28, 28\) needs \d+',
    ):
      registry.load_source('mnist', root)

  def test_mnist_with_only_one_train_file(self):
    root, directory = self._mnist_copy()
    fake_files.write_fake_idx_set(directory, splits=('train',))
    os.remove(os.path.join(directory, 'train-labels-idx1-ubyte.gz'))
    with self.assertRaisesRegex(source_lib.DataError, 'Only one of the MNIST'):
      registry.load_source('mnist', root)

  def test_mnist_uses_train_files_when_present(self):
    root, directory = self._mnist_copy()
    fake_files.write_fake_idx_set(directory, splits=('train',), n=4)
    source = registry.load_source('mnist', root)
    np.testing.assert_array_equal(source.is_test, [False] * 4 + [True] * 6)


if __name__ == '__main__':
  absltest.main()
