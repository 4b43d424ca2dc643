"""Tests for tff_fair.data.sources.cifar10 and its decode cache.

`RealFilesTest` reads `TFF_FAIR_DATA_DIR` and is skipped, by name, where
the file is absent (see tests/real_data.py).
"""

import os
from unittest import mock

from absl.testing import absltest
import numpy as np

from tests import real_data
from tests.data.sources import fake_files
from tff_fair.data.sources import cache
from tff_fair.data.sources import cifar10
from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib

_CIFAR_FILE = 'cifar10/cifar10_jpeg.tar'


class RealFilesTest(absltest.TestCase):
  """Loaders on the real offline files; facts from the data README."""

  def test_cifar10_subset(self):
    cache_dir = self.create_tempdir().full_path
    source = registry.load_source(
        'cifar10', real_data.data_dir_with(_CIFAR_FILE), max_examples=60,
        cache_dir=cache_dir,
    )
    self.assertEqual(source.x.shape, (60, 32, 32, 3))
    self.assertEqual(source.x.dtype, np.float32)
    self.assertBetween(float(source.x.min()), 0.0, 1.0)
    self.assertBetween(float(source.x.max()), 0.0, 1.0)
    self.assertBetween(float(source.x.mean()), 0.3, 0.6)
    # 3 per (split, class): stratified first-k.
    for is_test in (False, True):
      np.testing.assert_array_equal(
          np.bincount(source.y[source.is_test == is_test], minlength=10),
          [3] * 10,
      )
    self.assertFalse(source.is_test[:30].any())  # Train first.
    self.assertEmpty(os.listdir(cache_dir))  # Subsets are never cached.


class FakeFilesTest(absltest.TestCase):
  """The loader on small files written here in the real formats."""

  def test_cifar10_jpeg_tar(self):
    root = self.create_tempdir().full_path
    members = [('train/cat/0000.jpg', fake_files.jpeg(40)),
               ('train/truck/0001.jpg', fake_files.jpeg(200)),
               ('test/airplane/0000.jpg', fake_files.jpeg(120))]
    fake_files.write_fake_cifar_tar(os.path.join(root, 'cifar10'), members)
    source = registry.load_source('cifar10', root, cache_dir=root)
    self.assertEqual(source.x.shape, (3, 32, 32, 3))
    order = np.argsort(source.y)  # Member order within a split may change.
    np.testing.assert_array_equal(source.y[order], [0, 3, 9])
    np.testing.assert_array_equal(source.is_test[order], [True, False, False])
    # JPEG at quality 100 of a flat image decodes to within 1/255.
    np.testing.assert_allclose(source.x[order].mean(axis=(1, 2, 3)),
                               [120 / 255, 40 / 255, 200 / 255], atol=2 / 255)

  def test_cifar_bad_member_name(self):
    root = self.create_tempdir().full_path
    fake_files.write_fake_cifar_tar(
        os.path.join(root, 'cifar10'),
        [('train/unicorn/0000.jpg', fake_files.jpeg(5))]
    )
    with self.assertRaisesRegex(
        source_lib.DataError, "Unexpected member 'train/unicorn"
    ):
      registry.load_source('cifar10', root, cache_dir=root)

  def test_cifar_corrupt_jpeg(self):
    root = self.create_tempdir().full_path
    fake_files.write_fake_cifar_tar(
        os.path.join(root, 'cifar10'),
        [('train/cat/0000.jpg', b'not a jpeg at all')],
    )
    with self.assertRaisesRegex(source_lib.DataError, 'could not be decoded'):
      registry.load_source('cifar10', root, cache_dir=root)


class CifarCacheTest(absltest.TestCase):

  def test_cache_written_atomically_and_reused(self):
    root = self.create_tempdir().full_path
    cache_dir = os.path.join(root, 'cache')
    blobs = [
        ('test/dog/0000.jpg', fake_files.jpeg(200)),
        ('train/cat/0000.jpg', fake_files.jpeg(10)),
        ('train/airplane/0000.jpg', fake_files.jpeg(100)),
    ]
    tar_path = fake_files.write_fake_cifar_tar(
        os.path.join(root, 'cifar10'), blobs)
    first = registry.load_source('cifar10', root, cache_dir=cache_dir)
    # Train members come first whatever the tar order is.
    np.testing.assert_array_equal(first.is_test, [False, False, True])
    np.testing.assert_array_equal(first.y, [3, 0, 5])
    self.assertAlmostEqual(float(first.x[1].mean()), 100 / 255, delta=0.01)
    cached = os.listdir(cache_dir)
    self.assertLen(cached, 1)
    self.assertTrue(cached[0].endswith('.npz'))  # No *.tmp left behind.

    # Second load must not decode again.
    with mock.patch.object(
        cifar10, '_decode_tar', side_effect=AssertionError('decoded')
    ):
      second = registry.load_source('cifar10', root, cache_dir=cache_dir)
    np.testing.assert_array_equal(first.x, second.x)

    # A changed tar (other mtime) gets a new cache entry.
    os.utime(tar_path, ns=(1, 1))
    registry.load_source('cifar10', root, cache_dir=cache_dir)
    self.assertLen(os.listdir(cache_dir), 2)

  def test_env_cache_dir(self):
    root = self.create_tempdir().full_path
    fake_files.write_fake_cifar_tar(
        os.path.join(root, 'cifar10'),
        [('train/cat/0000.jpg', fake_files.jpeg(1))]
    )
    env_cache = os.path.join(root, 'env_cache')
    with mock.patch.dict(os.environ, {cache.CACHE_DIR_ENV: env_cache}):
      registry.load_source('cifar10', root)
    self.assertLen(os.listdir(env_cache), 1)

  def test_corrupt_cache_is_ignored(self):
    root = self.create_tempdir().full_path
    cache_dir = os.path.join(root, 'cache')
    tar_path = fake_files.write_fake_cifar_tar(
        os.path.join(root, 'cifar10'),
        [('train/cat/0000.jpg', fake_files.jpeg(1))]
    )
    os.makedirs(cache_dir)
    with open(cifar10._cache_path(tar_path, cache_dir), 'wb') as f:
      f.write(b'garbage')
    source = registry.load_source('cifar10', root, cache_dir=cache_dir)
    self.assertEqual(source.num_examples, 1)


if __name__ == '__main__':
  absltest.main()
