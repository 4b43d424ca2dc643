"""Tests for tff_fair.data.sources.

Every loader's parsing path runs on small files these tests write in the
real formats (idx gz, npz, h5, JPEG tar, stsa text), so it is tested on any
machine. `RealFilesTest` checks the real files (counts, checksums) from
`TFF_FAIR_DATA_DIR` and Fashion-MNIST's folder; each of its tests is skipped,
by name, where its file is absent (see tests/real_data.py).
"""

import collections
import dataclasses
import io
import gzip
import os
import socket
import tarfile
import tempfile
from unittest import mock
import urllib.parse

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from tests import real_data
from tff_fair.data import sources

_MNIST_FILES = ('mnist/t10k-images-idx3-ubyte.gz',
                'mnist/t10k-labels-idx1-ubyte.gz')
_FEMNIST_FILE = 'femnist/femnist_partial.npz'
_SHAKESPEARE_FILES = ('shakespeare/shakespeare_train.h5',
                      'shakespeare/shakespeare_test.h5')
_SST2_FILES = tuple(f'sst2/stsa.binary.{s}' for s in ('train', 'dev', 'test'))
_CIFAR_FILE = 'cifar10/cifar10_jpeg.tar'


def _idx_bytes(array: np.ndarray) -> bytes:
  """Encodes an array in IDX format (uint8 or >i4)."""
  codes = {np.dtype('u1'): 0x08, np.dtype('>i4'): 0x0C}
  header = bytes([0, 0, codes[array.dtype], array.ndim])
  header += b''.join(int(d).to_bytes(4, 'big') for d in array.shape)
  return header + array.tobytes()


def _write_gz(path: str, payload: bytes) -> None:
  with gzip.open(path, 'wb') as f:
    f.write(payload)


def _write_fake_idx_set(directory: str, splits=('train', 't10k'), n=6):
  """Writes tiny (Fashion-)MNIST idx files; label i for image i % 10."""
  os.makedirs(directory, exist_ok=True)
  for split in splits:
    images = (np.arange(n * 28 * 28) % 256).astype(np.uint8).reshape(n, 28, 28)
    labels = (np.arange(n) % 10).astype(np.uint8)
    _write_gz(
        os.path.join(directory, f'{split}-images-idx3-ubyte.gz'),
        _idx_bytes(images),
    )
    _write_gz(
        os.path.join(directory, f'{split}-labels-idx1-ubyte.gz'),
        _idx_bytes(labels),
    )


def _jpeg(value: int) -> bytes:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  image = np.full((32, 32, 3), value, np.uint8)
  return tf.io.encode_jpeg(image, quality=100).numpy()


def _write_fake_cifar_tar(directory: str, names_and_blobs) -> str:
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, 'cifar10_jpeg.tar')
  with tarfile.open(path, 'w') as tar:
    for name, blob in names_and_blobs:
      info = tarfile.TarInfo(name)
      info.size = len(blob)
      tar.addfile(info, io.BytesIO(blob))
  return path


class RealFilesTest(parameterized.TestCase):
  """Loaders on the real offline files; facts from the data README."""

  def test_fashion_mnist(self):
    real_data.fashion_mnist_dir()
    source = sources.load_source('fashion_mnist')
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

  def test_mnist_test_set(self):
    source = sources.load_source('mnist',
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

  def test_femnist(self):
    source = sources.load_source('femnist',
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

  def test_shakespeare(self):
    source = sources.load_source(
        'shakespeare', real_data.data_dir_with(*_SHAKESPEARE_FILES))
    self.assertLen(source.group_names, 715)
    self.assertEqual(source.num_classes, 90)
    self.assertEqual(source.x.shape[1:], (80,))
    self.assertEqual(source.y.shape, source.x.shape)
    self.assertEqual(source.x.dtype, np.int32)
    self.assertEqual(source.y.dtype, np.int32)
    np.testing.assert_array_equal(source.x[:, 1:], source.y[:, :-1])
    self.assertBetween(int(source.x.max()), 1, 89)
    windows = np.concatenate([source.x, source.y[:, -1:]], axis=1)
    for is_test, snippets, characters in (
        (False, 16068, 2359315),
        (True, 2356, 339752),
    ):
      part = windows[source.is_test == is_test]
      # One BOS per snippet, at the start of its first window.
      bos = sources.SHAKESPEARE_BOS_ID
      self.assertEqual(int((part == bos).sum()), snippets)
      self.assertEqual(
          int((part[:, 0] == sources.SHAKESPEARE_BOS_ID).sum()), snippets
      )
      # Every character of the README's count becomes one id in 1..87.
      self.assertEqual(int(((part >= 1) & (part <= 87)).sum()), characters)
      self.assertLen(np.unique(source.groups[source.is_test == is_test]), 715)

  def test_shakespeare_matches_tff_preprocessing(self):
    import h5py  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.simulation.baselines import client_spec  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.simulation.baselines.shakespeare import char_prediction_preprocessing as tff_pre  # pylint: disable=g-import-not-at-top

    self.assertEqual(tuple(tff_pre.CHAR_VOCAB), sources.SHAKESPEARE_CHAR_VOCAB)
    self.assertEqual(
        tff_pre.get_special_tokens(),
        (
            sources.SHAKESPEARE_PAD_ID,
            sources.SHAKESPEARE_OOV_ID,
            sources.SHAKESPEARE_BOS_ID,
            sources.SHAKESPEARE_EOS_ID,
        ),
    )
    role = 'ALL_S_WELL_THAT_ENDS_WELL_ADAM'
    data_dir = real_data.data_dir_with(*_SHAKESPEARE_FILES)
    path = os.path.join(data_dir, 'shakespeare', 'shakespeare_train.h5')
    with h5py.File(path, 'r') as f:
      snippets = f['examples'][role]['snippets'][()]
    preprocess = tff_pre.create_preprocess_fn(
        client_spec.ClientSpec(
            num_epochs=1, batch_size=10000, shuffle_buffer_size=1
        )
    )
    tff_x, tff_y = next(
        iter(
            preprocess(
                tf.data.Dataset.from_tensor_slices(
                    collections.OrderedDict(snippets=snippets)
                )
            )
        )
    )
    source = sources.load_source('shakespeare', data_dir)
    mask = (source.groups == source.group_names.index(role)) & ~source.is_test
    np.testing.assert_array_equal(source.x[mask], tff_x.numpy())
    np.testing.assert_array_equal(source.y[mask], tff_y.numpy())

  def test_sst2(self):
    data_dir = real_data.data_dir_with(*_SST2_FILES)
    source = sources.load_source('sst2', data_dir)
    self.assertEqual(source.x.shape, (6920 + 872 + 1821, 50))
    self.assertEqual(source.x.dtype, np.int32)
    self.assertEqual(int(source.is_test.sum()), 1821)
    np.testing.assert_array_equal(np.bincount(source.y[:6920]), [3310, 3610])
    np.testing.assert_array_equal(
        np.bincount(source.y[6920:7792]), [428, 444]
    )
    np.testing.assert_array_equal(
        np.bincount(source.y[source.is_test]), [912, 909]
    )
    num_tokens = source.metadata['num_tokens']
    self.assertEqual(num_tokens, len(source.metadata['vocabulary']) + 2)
    self.assertLess(int(source.x.max()), num_tokens)
    # The vocabulary comes from train only: every train token is known...
    self.assertFalse((source.x[:6920] == sources.SST2_OOV_ID).any())
    # ...while dev/test contain unseen words.
    self.assertTrue((source.x[6920:] == sources.SST2_OOV_ID).any())
    # First train sentence decodes back to its tokens.
    with open(os.path.join(data_dir, 'sst2', 'stsa.binary.train')) as f:
      label, text = f.readline().rstrip('\n').split(' ', 1)
    vocabulary = source.metadata['vocabulary']
    decoded = [vocabulary[i - 2] for i in source.x[0] if i >= 2]
    self.assertEqual(decoded, text.split()[:50])
    self.assertEqual(int(source.y[0]), int(label))

  def test_cifar10_subset(self):
    cache_dir = self.create_tempdir().full_path
    source = sources.load_source(
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

  def test_digits(self):
    source = sources.load_source('digits')
    self.assertEqual(source.x.shape, (1797, 8, 8, 1))
    self.assertEqual(source.x.dtype, np.float32)
    self.assertEqual(float(source.x.max()), 1.0)
    self.assertFalse(source.is_test.any())
    self.assertEqual(source.num_classes, 10)

  def test_max_examples_keeps_every_writer(self):
    source = sources.load_source(
        'femnist', real_data.data_dir_with(_FEMNIST_FILE), max_examples=420)
    self.assertEqual(source.num_examples, 420)
    # 2 per (split, writer) strata round-robin: every writer in both splits.
    for split in (False, True):
      self.assertLen(np.unique(source.groups[source.is_test == split]), 105)


class FakeFilesTest(parameterized.TestCase):
  """Each loader parses small files written here in the real formats."""

  def test_fashion_mnist_idx_gz(self):
    root = self.create_tempdir().full_path
    _write_fake_idx_set(os.path.join(root, 'fashion-mnist'), n=12)
    source = sources.load_source('fashion_mnist', root)
    self.assertEqual(source.x.shape, (24, 28, 28, 1))
    self.assertEqual(source.x.dtype, np.float32)
    np.testing.assert_array_equal(source.is_test, [False] * 12 + [True] * 12)
    np.testing.assert_array_equal(source.y[:12], np.arange(12) % 10)
    # Pixel 1 of image 0 is byte 1: scaled by 255.
    self.assertAlmostEqual(float(source.x[0, 0, 1, 0]), 1 / 255, places=6)
    self.assertEqual(source.metadata['class_names'][0], 'T-shirt/top')

  def test_mnist_test_files_only(self):
    root = self.create_tempdir().full_path
    _write_fake_idx_set(os.path.join(root, 'mnist'), splits=('t10k',), n=5)
    source = sources.load_source('mnist', root)
    self.assertEqual(source.x.shape, (5, 28, 28, 1))
    self.assertTrue(source.is_test.all())
    np.testing.assert_array_equal(source.y, [0, 1, 2, 3, 4])

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
    source = sources.load_source('femnist', root.full_path)
    self.assertEqual(source.x.shape, (7, 28, 28, 1))
    self.assertEqual(source.num_classes, 62)
    np.testing.assert_array_equal(source.y, [0, 61, 10, 36, 9, 5, 35])
    np.testing.assert_array_equal(source.groups, [0, 0, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(source.is_test, [False] * 5 + [True] * 2)
    self.assertEqual(source.group_names, ('f0001_01', 'f0002_02'))
    self.assertEqual(float(source.x[2, 3, 4, 0]), 1.0)
    self.assertEqual(float(source.x.sum()), 1.0)

  def test_shakespeare_h5(self):
    import h5py  # pylint: disable=g-import-not-at-top

    root = self.create_tempdir()
    root.mkdir('shakespeare')
    text = {
        'train': {'ROLE_A': [b'To be', b'x' * 85], 'ROLE_B': [b'Hi']},
        'test': {'ROLE_A': [b'Or not'], 'ROLE_B': [b'Bye']},
    }
    for split, roles in text.items():
      path = os.path.join(root.full_path, 'shakespeare',
                          f'shakespeare_{split}.h5')
      with h5py.File(path, 'w') as f:
        for role, snippets in roles.items():
          f.create_dataset(f'examples/{role}/snippets',
                           data=np.array(snippets, dtype=object),
                           dtype=h5py.string_dtype('utf-8'))
    source = sources.load_source('shakespeare', root.full_path)
    self.assertEqual(source.group_names, ('ROLE_A', 'ROLE_B'))
    # One window per short snippet; 'x' * 85 + BOS + EOS = 87 ids: two.
    self.assertEqual(source.x.shape, (6, 80))
    np.testing.assert_array_equal(source.is_test, [False] * 4 + [True] * 2)
    np.testing.assert_array_equal(source.groups, [0, 0, 0, 1, 0, 1])
    bos, eos = sources.SHAKESPEARE_BOS_ID, sources.SHAKESPEARE_EOS_ID
    expected = np.concatenate([[bos], sources.shakespeare_char_ids(b'To be'),
                               [eos]])
    np.testing.assert_array_equal(source.x[0, :7], expected)
    np.testing.assert_array_equal(source.y[0, :6], expected[1:])
    self.assertEqual(int(source.x[0, 7:].sum()), 0)  # Padding.
    np.testing.assert_array_equal(source.x[:, 1:], source.y[:, :-1])

  def test_sst2_stsa_text(self):
    root = self.create_tempdir()
    directory = root.mkdir('sst2')
    directory.create_file('stsa.binary.train',
                          '1 a good film\n0 a bad film\n\n1 good good\n')
    directory.create_file('stsa.binary.dev', '0 bad acting\n')
    directory.create_file('stsa.binary.test', '1 unseen words here\n')
    source = sources.load_sst2(root.full_path, max_len=4)
    np.testing.assert_array_equal(source.y, [1, 0, 1, 0, 1])
    np.testing.assert_array_equal(source.is_test, [False] * 4 + [True])
    vocabulary = source.metadata['vocabulary']
    # Train words only, most frequent first, ties alphabetical.
    self.assertEqual(vocabulary, ('good', 'a', 'film', 'bad'))
    self.assertEqual(source.metadata['num_tokens'], 6)
    np.testing.assert_array_equal(source.x[0], [3, 2, 4, 0])
    # 'acting' and the test words were never seen in train: OOV.
    np.testing.assert_array_equal(source.x[3], [5, sources.SST2_OOV_ID, 0, 0])
    np.testing.assert_array_equal(source.x[4], [sources.SST2_OOV_ID] * 3 + [0])

  def test_cifar10_jpeg_tar(self):
    root = self.create_tempdir().full_path
    members = [('train/cat/0000.jpg', _jpeg(40)),
               ('train/truck/0001.jpg', _jpeg(200)),
               ('test/airplane/0000.jpg', _jpeg(120))]
    _write_fake_cifar_tar(os.path.join(root, 'cifar10'), members)
    source = sources.load_source('cifar10', root, cache_dir=root)
    self.assertEqual(source.x.shape, (3, 32, 32, 3))
    order = np.argsort(source.y)  # Member order within a split may change.
    np.testing.assert_array_equal(source.y[order], [0, 3, 9])
    np.testing.assert_array_equal(source.is_test[order], [True, False, False])
    # JPEG at quality 100 of a flat image decodes to within 1/255.
    np.testing.assert_allclose(source.x[order].mean(axis=(1, 2, 3)),
                               [120 / 255, 40 / 255, 200 / 255], atol=2 / 255)


class ErrorTest(parameterized.TestCase):

  def test_unknown_name(self):
    with self.assertRaisesRegex(
        sources.DataError, r"Unknown data set 'emnist'.*Valid names: fashion"
    ):
      sources.load_source('emnist')

  def test_no_data_dir(self):
    with mock.patch.dict(os.environ, {sources.DATA_DIR_ENV: ''}):
      with self.assertRaisesRegex(
          sources.DataError, 'No data directory given.*TFF_FAIR_DATA_DIR'
      ):
        sources.load_source('mnist')

  def test_missing_dataset_directory(self):
    root = self.create_tempdir().full_path
    with self.assertRaisesRegex(
        sources.DataError, r'Directory .*femnist not found.*data_dir'
    ):
      sources.load_source('femnist', root)

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
    with self.assertRaisesRegex(sources.DataError, message):
      sources.load_source(name, root.full_path)

  def test_missing_fashion_mnist_file_says_how_to_fix(self):
    root = self.create_tempdir().full_path
    directory = os.path.join(root, 'fashion-mnist')
    _write_fake_idx_set(directory)
    os.remove(os.path.join(directory, 'train-images-idx3-ubyte.gz'))
    with self.assertRaisesRegex(
        sources.DataError,
        'Fashion-MNIST file train-images-idx3-ubyte.gz not found in'
        f' {directory}. Install the Debian package .apt-get install'
        ' dataset-fashion-mnist., set TFF_FAIR_FASHION_MNIST_DIR, or pass'
        ' use_tfds=True',
    ):
      sources.load_source('fashion_mnist', root)

  def _mnist_copy(self) -> tuple[str, str]:
    """Temp data dir with mnist/ holding tiny valid t10k files."""
    root = self.create_tempdir().full_path
    directory = os.path.join(root, 'mnist')
    _write_fake_idx_set(directory, splits=('t10k',))
    return root, directory

  def test_truncated_gzip(self):
    root, directory = self._mnist_copy()
    labels = os.path.join(directory, 't10k-labels-idx1-ubyte.gz')
    with open(labels, 'rb') as f:
      payload = f.read()
    with open(labels, 'wb') as f:
      f.write(payload[: len(payload) // 2])
    with self.assertRaisesRegex(
        sources.DataError,
        r'Could not decompress .*t10k-labels-idx1-ubyte.gz.*corrupt or'
        ' truncated',
    ):
      sources.load_source('mnist', root)

  def test_idx_payload_shorter_than_header(self):
    root, directory = self._mnist_copy()
    path = os.path.join(directory, 't10k-images-idx3-ubyte.gz')
    with gzip.open(path, 'rb') as f:
      raw = f.read()
    _write_gz(path, raw[:-100])
    with self.assertRaisesRegex(
        sources.DataError,
        r't10k-images-idx3-ubyte.gz holds \d+ bytes but its IDX header'
        r' \(6, 28, 28\) needs \d+',
    ):
      sources.load_source('mnist', root)

  def test_idx_bad_magic(self):
    path = os.path.join(self.create_tempdir().full_path, 'x-idx1-ubyte')
    with open(path, 'wb') as f:
      f.write(b'\x12\x34\x08\x01' + bytes(8))
    with self.assertRaisesRegex(sources.DataError, 'not an IDX file'):
      sources.read_idx(path)

  def test_read_idx_round_trip(self):
    path = os.path.join(self.create_tempdir().full_path, 'a.idx')
    array = np.arange(24, dtype='>i4').reshape(2, 3, 4)
    with open(path, 'wb') as f:
      f.write(_idx_bytes(array))
    result = sources.read_idx(path)
    np.testing.assert_array_equal(result, array)
    self.assertTrue(result.dtype.isnative)

  def test_mnist_with_only_one_train_file(self):
    root, directory = self._mnist_copy()
    _write_fake_idx_set(directory, splits=('train',))
    os.remove(os.path.join(directory, 'train-labels-idx1-ubyte.gz'))
    with self.assertRaisesRegex(sources.DataError, 'Only one of the MNIST'):
      sources.load_source('mnist', root)

  def test_mnist_uses_train_files_when_present(self):
    root, directory = self._mnist_copy()
    _write_fake_idx_set(directory, splits=('train',), n=4)
    source = sources.load_source('mnist', root)
    np.testing.assert_array_equal(source.is_test, [False] * 4 + [True] * 6)

  def test_use_tfds_unsupported_name(self):
    with self.assertRaisesRegex(sources.DataError, 'use_tfds supports'):
      sources.load_source('femnist', use_tfds=True)

  @parameterized.parameters(0, -3, 2.5)
  def test_bad_max_examples(self, value):
    with self.assertRaisesRegex(sources.DataError, 'max_examples must be'):
      sources.load_source('digits', max_examples=value)

  def test_sst2_malformed_line(self):
    root = self.create_tempdir()
    directory = root.mkdir('sst2')
    directory.create_file('stsa.binary.train', '1 good film\n7 what\n')
    for split in ('dev', 'test'):
      directory.create_file(f'stsa.binary.{split}', '0 bad\n')
    with self.assertRaisesRegex(
        sources.DataError, r'stsa.binary.train:2: expected "<0\|1> <sentence>"'
    ):
      sources.load_source('sst2', root.full_path)

  def test_femnist_missing_arrays(self):
    root = self.create_tempdir()
    root.mkdir('femnist')
    np.savez(
        os.path.join(root.full_path, 'femnist', 'femnist_partial.npz'),
        x_train=np.zeros((1, 28, 28), np.uint8),
    )
    with self.assertRaisesRegex(
        sources.DataError, r'lacks the arrays .*y_train'
    ):
      sources.load_source('femnist', root.full_path)

  def test_shakespeare_wrong_layout(self):
    import h5py  # pylint: disable=g-import-not-at-top

    root = self.create_tempdir()
    root.mkdir('shakespeare')
    for split in ('train', 'test'):
      path = os.path.join(
          root.full_path, 'shakespeare', f'shakespeare_{split}.h5'
      )
      with h5py.File(path, 'w') as f:
        f.create_dataset('other', data=np.zeros(3))
    with self.assertRaisesRegex(sources.DataError, 'has no /examples group'):
      sources.load_source('shakespeare', root.full_path)

  def test_cifar_bad_member_name(self):
    root = self.create_tempdir().full_path
    _write_fake_cifar_tar(
        os.path.join(root, 'cifar10'), [('train/unicorn/0000.jpg', _jpeg(5))]
    )
    with self.assertRaisesRegex(
        sources.DataError, "Unexpected member 'train/unicorn"
    ):
      sources.load_source('cifar10', root, cache_dir=root)

  def test_cifar_corrupt_jpeg(self):
    root = self.create_tempdir().full_path
    _write_fake_cifar_tar(
        os.path.join(root, 'cifar10'),
        [('train/cat/0000.jpg', b'not a jpeg at all')],
    )
    with self.assertRaisesRegex(sources.DataError, 'could not be decoded'):
      sources.load_source('cifar10', root, cache_dir=root)

  def test_source_length_mismatch(self):
    with self.assertRaisesRegex(sources.DataError, 'same length'):
      sources.Source(
          name='bad',
          x=np.zeros((3, 2)),
          y=np.zeros(2, np.int32),
          num_classes=2,
          is_test=np.zeros(3, bool),
      )


class CifarCacheTest(absltest.TestCase):

  def test_cache_written_atomically_and_reused(self):
    root = self.create_tempdir().full_path
    cache_dir = os.path.join(root, 'cache')
    blobs = [
        ('test/dog/0000.jpg', _jpeg(200)),
        ('train/cat/0000.jpg', _jpeg(10)),
        ('train/airplane/0000.jpg', _jpeg(100)),
    ]
    tar_path = _write_fake_cifar_tar(os.path.join(root, 'cifar10'), blobs)
    first = sources.load_source('cifar10', root, cache_dir=cache_dir)
    # Train members come first whatever the tar order is.
    np.testing.assert_array_equal(first.is_test, [False, False, True])
    np.testing.assert_array_equal(first.y, [3, 0, 5])
    self.assertAlmostEqual(float(first.x[1].mean()), 100 / 255, delta=0.01)
    cached = os.listdir(cache_dir)
    self.assertLen(cached, 1)
    self.assertTrue(cached[0].endswith('.npz'))  # No *.tmp left behind.

    # Second load must not decode again.
    with mock.patch.object(
        sources, '_decode_cifar_tar', side_effect=AssertionError('decoded')
    ):
      second = sources.load_source('cifar10', root, cache_dir=cache_dir)
    np.testing.assert_array_equal(first.x, second.x)

    # A changed tar (other mtime) gets a new cache entry.
    os.utime(tar_path, ns=(1, 1))
    sources.load_source('cifar10', root, cache_dir=cache_dir)
    self.assertLen(os.listdir(cache_dir), 2)

  def test_env_cache_dir(self):
    root = self.create_tempdir().full_path
    _write_fake_cifar_tar(
        os.path.join(root, 'cifar10'), [('train/cat/0000.jpg', _jpeg(1))]
    )
    env_cache = os.path.join(root, 'env_cache')
    with mock.patch.dict(os.environ, {sources.CACHE_DIR_ENV: env_cache}):
      sources.load_source('cifar10', root)
    self.assertLen(os.listdir(env_cache), 1)

  def test_corrupt_cache_is_ignored(self):
    root = self.create_tempdir().full_path
    cache_dir = os.path.join(root, 'cache')
    tar_path = _write_fake_cifar_tar(
        os.path.join(root, 'cifar10'), [('train/cat/0000.jpg', _jpeg(1))]
    )
    os.makedirs(cache_dir)
    with open(sources._cifar_cache_path(tar_path, cache_dir), 'wb') as f:
      f.write(b'garbage')
    source = sources.load_source('cifar10', root, cache_dir=cache_dir)
    self.assertEqual(source.num_examples, 1)


class FashionDirectoryTest(absltest.TestCase):

  def test_candidate_order(self):
    env = {
        sources.FASHION_MNIST_DIR_ENV: '/env/fashion',
        sources.DATA_DIR_ENV: '/env/data',
    }
    with mock.patch.dict(os.environ, env):
      self.assertEqual(
          sources.fashion_mnist_dir_candidates('/arg'),
          [
              '/arg/fashion-mnist',
              '/env/fashion',
              '/env/data/fashion-mnist',
              sources.SYSTEM_FASHION_MNIST_DIR,
          ],
      )

  def test_explicit_data_dir_wins(self):
    root = self.create_tempdir().full_path
    _write_fake_idx_set(os.path.join(root, 'fashion-mnist'), n=3)
    with mock.patch.dict(
        os.environ, {sources.FASHION_MNIST_DIR_ENV: '/nonexistent'}
    ):
      source = sources.load_source('fashion_mnist', root)
    self.assertEqual(source.x.shape, (6, 28, 28, 1))
    self.assertEqual(
        source.metadata['directory'], os.path.join(root, 'fashion-mnist')
    )

  def test_env_dir_used(self):
    directory = os.path.join(self.create_tempdir().full_path, 'fm')
    _write_fake_idx_set(directory, n=2)
    with mock.patch.dict(
        os.environ,
        {sources.FASHION_MNIST_DIR_ENV: directory, sources.DATA_DIR_ENV: ''},
    ):
      source = sources.load_source('fashion_mnist')
    self.assertEqual(source.num_examples, 4)


class TfdsConversionTest(absltest.TestCase):

  def test_converts_fake_arrays(self):
    train = (
        np.full((4, 28, 28, 1), 255, np.uint8),
        np.array([0, 1, 2, 3], np.int64),
    )
    test = (np.zeros((2, 28, 28, 1), np.uint8), np.array([9, 8], np.int64))
    source = sources.source_from_tfds_arrays('fashion_mnist', train, test)
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
        sources.DataError, r'expected uint8 \(N,\)\+\(32, 32, 3\)'
    ):
      sources.source_from_tfds_arrays(
          'cifar10', (images, np.zeros(2)), (images, np.zeros(2))
      )

  def test_rejects_unknown_name(self):
    with self.assertRaisesRegex(sources.DataError, 'use_tfds supports'):
      sources.source_from_tfds_arrays('sst2', (None, None), (None, None))

  def test_load_source_uses_tfds_loader(self):
    fake = sources.source_from_tfds_arrays(
        'mnist',
        (np.zeros((5, 28, 28, 1), np.uint8), np.arange(5)),
        (np.zeros((5, 28, 28, 1), np.uint8), np.arange(5)),
    )
    with mock.patch.object(
        sources, '_load_with_tfds', return_value=fake
    ) as load:
      source = sources.load_source(
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
    for name in sources.TFDS_SOURCE_NAMES:
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
      _write_fake_idx_set(files_dir, splits=(split,), n=n)
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

    source = sources.load_source('mnist', data_dir, use_tfds=True)
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
    self.assertEqual(source.metadata['class_names'], sources.DIGIT_CLASSES)


class OwnSourceTest(absltest.TestCase):
  """`Source(x, y, num_classes, is_test)` from a user's numpy arrays."""

  def test_positional_arrays_get_a_name_and_the_models_dtypes(self):
    x = np.zeros((4, 3, 3, 1))  # float64, numpy's default
    y = np.array([0, 1, 2, 1])  # int64
    source = sources.Source(x, y, 3, np.array([False, False, True, True]))
    self.assertEqual(source.name, sources.OWN_SOURCE_NAME)
    self.assertEqual(source.x.dtype, np.float32)
    self.assertEqual(source.y.dtype, sources.LABEL_DTYPE)
    tokens = sources.Source(np.ones((2, 5), np.int64), np.zeros(2, np.int64),
                            2, np.zeros(2, bool), name='texts')
    self.assertEqual(tokens.x.dtype, sources.TOKEN_DTYPE)
    self.assertEqual(tokens.name, 'texts')

  def test_float_labels_refused(self):
    with self.assertRaisesRegex(sources.DataError,
                                'y must hold integer class ids, got float64'):
      sources.Source(np.zeros((2, 3)), np.array([0.0, 1.0]), 2,
                     np.zeros(2, bool))


class HelpersTest(absltest.TestCase):

  def test_stratified_first_k_round_robin(self):
    strata = np.array([0, 0, 0, 0, 1, 1, 2])
    np.testing.assert_array_equal(
        sources.stratified_first_k(strata, 3), [0, 4, 6]
    )
    np.testing.assert_array_equal(
        sources.stratified_first_k(strata, 5), [0, 1, 4, 5, 6]
    )
    np.testing.assert_array_equal(
        sources.stratified_first_k(strata, 100), np.arange(7)
    )

  def test_shakespeare_windows(self):
    x, y = sources.shakespeare_windows(b'ab', sequence_length=3)
    a, b = (sources.SHAKESPEARE_CHAR_VOCAB.index(c) + 1 for c in 'ab')
    bos, eos = sources.SHAKESPEARE_BOS_ID, sources.SHAKESPEARE_EOS_ID
    np.testing.assert_array_equal(x, [[bos, a, b]])
    np.testing.assert_array_equal(y, [[a, b, eos]])
    x, _ = sources.shakespeare_windows('é'.encode(), sequence_length=80)
    oov = sources.SHAKESPEARE_OOV_ID
    np.testing.assert_array_equal(x[0, :4], [bos, oov, oov, eos])

  def test_vocabulary_and_encoding(self):
    sentences = [['b', 'a', 'b'], ['c', 'a', 'b']]
    vocabulary = sources.build_vocabulary(sentences)
    self.assertEqual(vocabulary, ('b', 'a', 'c'))
    ids = sources.encode_sentences([['a', 'zzz', 'b', 'c']], vocabulary, 3)
    np.testing.assert_array_equal(ids, [[3, sources.SST2_OOV_ID, 2]])
    ids = sources.encode_sentences([['c']], vocabulary, 3)
    np.testing.assert_array_equal(ids, [[4, 0, 0]])

  def test_source_is_read_only(self):
    source = sources.load_source('digits', max_examples=10)
    with self.assertRaises(TypeError):
      source.metadata['x'] = 1  # pytype: disable=unsupported-operands
    with self.assertRaises(dataclasses.FrozenInstanceError):
      source.name = 'other'  # pytype: disable=not-writable


if __name__ == '__main__':
  absltest.main()
