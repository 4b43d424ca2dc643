"""Tests for tff_fair.data.sources.sst2.

`RealFilesTest` reads `TFF_FAIR_DATA_DIR` and is skipped, by name, where
the files are absent (see tests/real_data.py).
"""

import os

from absl.testing import absltest
import numpy as np

from tests import real_data
from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib
from tff_fair.data.sources import sst2
from tff_fair.data.sources import tokenizers

_SST2_FILES = tuple(f'sst2/stsa.binary.{s}' for s in ('train', 'dev', 'test'))


class RealFilesTest(absltest.TestCase):
  """Loaders on the real offline files; facts from the data README."""

  def test_sst2(self):
    data_dir = real_data.data_dir_with(*_SST2_FILES)
    source = registry.load_source('sst2', data_dir)
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
    self.assertFalse((source.x[:6920] == tokenizers.SST2_OOV_ID).any())
    # ...while dev/test contain unseen words.
    self.assertTrue((source.x[6920:] == tokenizers.SST2_OOV_ID).any())
    # First train sentence decodes back to its tokens.
    with open(os.path.join(data_dir, 'sst2', 'stsa.binary.train')) as f:
      label, text = f.readline().rstrip('\n').split(' ', 1)
    vocabulary = source.metadata['vocabulary']
    decoded = [vocabulary[i - 2] for i in source.x[0] if i >= 2]
    self.assertEqual(decoded, text.split()[:50])
    self.assertEqual(int(source.y[0]), int(label))


class FakeFilesTest(absltest.TestCase):
  """The loader on small files written here in the real formats."""

  def test_sst2_stsa_text(self):
    root = self.create_tempdir()
    directory = root.mkdir('sst2')
    directory.create_file('stsa.binary.train',
                          '1 a good film\n0 a bad film\n\n1 good good\n')
    directory.create_file('stsa.binary.dev', '0 bad acting\n')
    directory.create_file('stsa.binary.test', '1 unseen words here\n')
    source = sst2.load_sst2(root.full_path, max_len=4)
    np.testing.assert_array_equal(source.y, [1, 0, 1, 0, 1])
    np.testing.assert_array_equal(source.is_test, [False] * 4 + [True])
    vocabulary = source.metadata['vocabulary']
    # Train words only, most frequent first, ties alphabetical.
    self.assertEqual(vocabulary, ('good', 'a', 'film', 'bad'))
    self.assertEqual(source.metadata['num_tokens'], 6)
    np.testing.assert_array_equal(source.x[0], [3, 2, 4, 0])
    # 'acting' and the test words were never seen in train: OOV.
    oov = tokenizers.SST2_OOV_ID
    np.testing.assert_array_equal(source.x[3], [5, oov, 0, 0])
    np.testing.assert_array_equal(source.x[4], [oov] * 3 + [0])

  def test_sst2_malformed_line(self):
    root = self.create_tempdir()
    directory = root.mkdir('sst2')
    directory.create_file('stsa.binary.train', '1 good film\n7 what\n')
    for split in ('dev', 'test'):
      directory.create_file(f'stsa.binary.{split}', '0 bad\n')
    with self.assertRaisesRegex(
        source_lib.DataError,
        r'stsa.binary.train:2: expected "<0\|1> <sentence>"'
    ):
      registry.load_source('sst2', root.full_path)


if __name__ == '__main__':
  absltest.main()
