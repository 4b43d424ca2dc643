"""Tests for tff_fair.data.sources.tfds_loader (`use_tfds=True`)."""

import os
import socket
import tempfile
from unittest import mock
import urllib.parse

from absl.testing import absltest
import numpy as np

from tests.data.sources import fake_files
from tff_fair.data.sources import digits
from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib
from tff_fair.data.sources import tfds_loader


class TfdsConversionTest(absltest.TestCase):

  def test_converts_fake_arrays(self):
    train = (
        np.full((4, 28, 28, 1), 255, np.uint8),
        np.array([0, 1, 2, 3], np.int64),
    )
    test = (np.zeros((2, 28, 28, 1), np.uint8), np.array([9, 8], np.int64))
    source = tfds_loader.source_from_tfds_arrays('fashion_mnist', train, test)
    self.assertEqual(source.x.shape, (6, 28, 28, 1))
    self.assertEqual(source.x.dtype, np.float32)
    self.assertEqual(float(source.x[:4].min()), 1.0)
    self.assertEqual(float(source.x[4:].max()), 0.0)
    self.assertEqual(source.y.dtype, np.int32)
    np.testing.assert_array_equal(source.is_test, [False] * 4 + [True] * 2)
    self.assertEqual(source.metadata['class_names'][0], 'T-shirt/top')

  def test_rejects_wrong_shape(self):
    images = np.zeros((2, 28, 28, 1), np.uint8)
    with self.assertRaisesRegex(
        source_lib.DataError, r'expected uint8 \(N,\)\+\(32, 32, 3\)'
    ):
      tfds_loader.source_from_tfds_arrays(
          'cifar10', (images, np.zeros(2)), (images, np.zeros(2))
      )

  def test_rejects_unknown_name(self):
    with self.assertRaisesRegex(source_lib.DataError, 'use_tfds supports'):
      tfds_loader.source_from_tfds_arrays('sst2', (None, None), (None, None))

  def test_load_source_uses_tfds_loader(self):
    fake = tfds_loader.source_from_tfds_arrays(
        'mnist',
        (np.zeros((5, 28, 28, 1), np.uint8), np.arange(5)),
        (np.zeros((5, 28, 28, 1), np.uint8), np.arange(5)),
    )
    with mock.patch.object(
        tfds_loader, 'load_with_tfds', return_value=fake
    ) as load:
      source = registry.load_source(
          'mnist', '/tfds', use_tfds=True, max_examples=4
      )
    load.assert_called_once_with('mnist', '/tfds')
    self.assertEqual(source.num_examples, 4)


class TfdsOfflineTest(absltest.TestCase):
  """`use_tfds=True` through TensorFlow Datasets itself, without a network.

  TFDS's own MNIST builder prepares the data set from idx files on disk
  (`manual_dir`, TFDS's route for files a user already has) through its
  download manager, checksum check, gzip extraction and record writer;
  `load_source` then reads it with `tfds.load`, as it would after a
  download. Only the checksums (of the test's files) and the example counts
  (MNIST's builder expects 60,000 + 10,000) differ from the real builder.
  """

  def setUp(self):
    super().setUp()
    # TFDS must not need the network: any connection attempt fails the test.
    no_network = AssertionError('the TFDS path tried to use the network')
    for name in ('connect', 'connect_ex'):
      patcher = mock.patch.object(socket.socket, name, side_effect=no_network)
      patcher.start()
      self.addCleanup(patcher.stop)
    patcher = mock.patch.object(socket, 'getaddrinfo', side_effect=no_network)
    patcher.start()
    self.addCleanup(patcher.stop)
    # A builder without prepared data leaves an empty temporary directory
    # (DatasetInfo.initialize_from_bucket): keep it in the test's.
    patcher = mock.patch.object(tempfile, 'tempdir',
                                self.create_tempdir().full_path)
    patcher.start()
    self.addCleanup(patcher.stop)

  def test_builders_resolve_their_downloads(self):
    # The step before any download: reading the builder's registered URLs.
    # It needs importlib_resources, which TFDS does not declare for 3.9+.
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    data_dir = self.create_tempdir().full_path
    for name in tfds_loader.TFDS_SOURCE_NAMES:
      with self.subTest(name):
        builder = tfds.builder(name, data_dir=data_dir)
        self.assertNotEmpty(type(builder).url_infos)

  def test_mnist_prepared_by_tfds_from_local_files(self):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    from tensorflow_datasets.core.download import checksums  # pylint: disable=g-import-not-at-top
    from tensorflow_datasets.image_classification import mnist  # pylint: disable=g-import-not-at-top

    files_dir = self.create_tempdir().full_path
    counts = {'train': 8, 't10k': 4}
    for split, n in counts.items():
      fake_files.write_fake_idx_set(files_dir, splits=(split,), n=n)
    local_url_infos = {
        urllib.parse.urljoin(mnist.MNIST.URL, name): checksums.compute_url_info(
            os.path.join(files_dir, name))
        for name in os.listdir(files_dir)
    }

    class LocalMnist(mnist.MNIST, skip_registration=True):
      """MNIST's builder with the test's checksums and example counts."""

      name = 'mnist'  # Writes where tfds.load('mnist') reads.
      url_infos = local_url_infos  # The download manager checks these.

      def _generate_examples(self, num_examples, data_path, label_path):
        del num_examples  # MNIST's full size; these files are smaller.
        with open(label_path, 'rb') as f:
          n = int.from_bytes(f.read(8)[4:], 'big')  # IDX header count.
        yield from super()._generate_examples(n, data_path, label_path)

    data_dir = self.create_tempdir().full_path
    LocalMnist(data_dir=data_dir).download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            manual_dir=files_dir, try_download_gcs=False))

    source = registry.load_source('mnist', data_dir, use_tfds=True)
    self.assertEqual(source.x.shape, (12, 28, 28, 1))
    self.assertEqual(source.x.dtype, np.float32)
    np.testing.assert_array_equal(source.is_test, [False] * 8 + [True] * 4)
    # TFDS shuffles within a split; the fake image i has label i.
    for split, n in counts.items():
      mask = source.is_test == (split == 't10k')
      self.assertCountEqual(source.y[mask], range(n))
      expected = (np.arange(n * 28 * 28) % 256).reshape(n, 28, 28, 1)
      np.testing.assert_array_equal(
          np.round(source.x[mask] * 255), expected[source.y[mask]])
    self.assertEqual(source.metadata['class_names'], digits.DIGIT_CLASSES)


if __name__ == '__main__':
  absltest.main()
