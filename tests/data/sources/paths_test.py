"""Tests for tff_fair.data.sources.paths: errors that say where files go."""

import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from tff_fair.data.sources import paths
from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib


class PathsTest(parameterized.TestCase):

  def test_no_data_dir(self):
    with mock.patch.dict(os.environ, {paths.DATA_DIR_ENV: ''}):
      with self.assertRaisesRegex(
          source_lib.DataError, 'No data directory given.*TFF_FAIR_DATA_DIR'
      ):
        registry.load_source('mnist')

  def test_missing_dataset_directory(self):
    root = self.create_tempdir().full_path
    with self.assertRaisesRegex(
        source_lib.DataError, r'Directory .*femnist not found.*data_dir'
    ):
      registry.load_source('femnist', root)

  @parameterized.parameters(
      ('mnist', 'mnist', 'MNIST file t10k-images-idx3-ubyte.gz not found'),
      ('femnist', 'femnist', 'FEMNIST file femnist_partial.npz not found'),
      ('cifar10', 'cifar10', 'CIFAR-10 file cifar10_jpeg.tar not found'),
      ('sst2', 'sst2', 'SST-2 file stsa.binary.train not found'),
      ('shakespeare', 'shakespeare', 'shakespeare_train.h5 not found'),
  )
  def test_missing_file(self, name, subdir, message):
    root = self.create_tempdir()
    root.mkdir(subdir)
    with self.assertRaisesRegex(source_lib.DataError, message):
      registry.load_source(name, root.full_path)


if __name__ == '__main__':
  absltest.main()
