"""Tests for tff_fair.data.sources.fashion_mnist.

`RealFilesTest` reads Fashion-MNIST's folder and is skipped, by name, where
the files are absent (see tests/real_data.py).
"""

import os
from unittest import mock

from absl.testing import absltest
import numpy as np

from tests import real_data
from tests.data.sources import fake_files
from tff_fair.data.sources import fashion_mnist
from tff_fair.data.sources import paths
from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib


class RealFilesTest(absltest.TestCase):
  """Loaders on the real offline files; facts from the data README."""

  def test_fashion_mnist(self):
    real_data.fashion_mnist_dir()
    source = registry.load_source('fashion_mnist')
    self.assertEqual(source.x.shape, (70000, 28, 28, 1))
    self.assertEqual(source.x.dtype, np.float32)
    self.assertEqual(source.y.dtype, np.int32)
    self.assertEqual(source.x.min(), 0.0)
    self.assertEqual(source.x.max(), 1.0)
    self.assertEqual(int(source.is_test.sum()), 10000)
    self.assertFalse(source.is_test[:60000].any())
    # Fashion-MNIST is balanced: 6,000 train and 1,000 test per class.
    np.testing.assert_array_equal(
        np.bincount(source.y[~source.is_test]), [6000] * 10
    )
    np.testing.assert_array_equal(
        np.bincount(source.y[source.is_test]), [1000] * 10
    )
    self.assertEqual(source.num_classes, 10)
    self.assertIsNone(source.groups)


class FakeFilesTest(absltest.TestCase):
  """The loader on small files written here in the real formats."""

  def test_fashion_mnist_idx_gz(self):
    root = self.create_tempdir().full_path
    fake_files.write_fake_idx_set(os.path.join(root, 'fashion-mnist'), n=12)
    source = registry.load_source('fashion_mnist', root)
    self.assertEqual(source.x.shape, (24, 28, 28, 1))
    self.assertEqual(source.x.dtype, np.float32)
    np.testing.assert_array_equal(source.is_test, [False] * 12 + [True] * 12)
    np.testing.assert_array_equal(source.y[:12], np.arange(12) % 10)
    # Pixel 1 of image 0 is byte 1: scaled by 255.
    self.assertAlmostEqual(float(source.x[0, 0, 1, 0]), 1 / 255, places=6)
    self.assertEqual(source.metadata['class_names'][0], 'T-shirt/top')

  def test_missing_fashion_mnist_file_says_how_to_fix(self):
    root = self.create_tempdir().full_path
    directory = os.path.join(root, 'fashion-mnist')
    fake_files.write_fake_idx_set(directory)
    os.remove(os.path.join(directory, 'train-images-idx3-ubyte.gz'))
    with self.assertRaisesRegex(
        source_lib.DataError,
        'Fashion-MNIST file train-images-idx3-ubyte.gz not found in'
        f' {directory}. Install the Debian package .apt-get install'
        ' dataset-fashion-mnist., set TFF_FAIR_FASHION_MNIST_DIR, or pass'
        ' use_tfds=True',
    ):
      registry.load_source('fashion_mnist', root)


class FashionDirectoryTest(absltest.TestCase):

  def test_candidate_order(self):
    env = {
        fashion_mnist.FASHION_MNIST_DIR_ENV: '/env/fashion',
        paths.DATA_DIR_ENV: '/env/data',
    }
    with mock.patch.dict(os.environ, env):
      self.assertEqual(
          fashion_mnist.fashion_mnist_dir_candidates('/arg'),
          [
              '/arg/fashion-mnist',
              '/env/fashion',
              '/env/data/fashion-mnist',
              fashion_mnist.SYSTEM_FASHION_MNIST_DIR,
          ],
      )

  def test_explicit_data_dir_wins(self):
    root = self.create_tempdir().full_path
    fake_files.write_fake_idx_set(os.path.join(root, 'fashion-mnist'), n=3)
    with mock.patch.dict(
        os.environ, {fashion_mnist.FASHION_MNIST_DIR_ENV: '/nonexistent'}
    ):
      source = registry.load_source('fashion_mnist', root)
    self.assertEqual(source.x.shape, (6, 28, 28, 1))
    self.assertEqual(
        source.metadata['directory'], os.path.join(root, 'fashion-mnist')
    )

  def test_env_dir_used(self):
    directory = os.path.join(self.create_tempdir().full_path, 'fm')
    fake_files.write_fake_idx_set(directory, n=2)
    with mock.patch.dict(
        os.environ,
        {fashion_mnist.FASHION_MNIST_DIR_ENV: directory,
         paths.DATA_DIR_ENV: ''},
    ):
      source = registry.load_source('fashion_mnist')
    self.assertEqual(source.num_examples, 4)


if __name__ == '__main__':
  absltest.main()
