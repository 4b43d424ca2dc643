"""Tests for tff_fair.data.sources.idx."""

import os

from absl.testing import absltest
import numpy as np

from tests.data.sources import fake_files
from tff_fair.data.sources import idx
from tff_fair.data.sources import source as source_lib


class ReadIdxTest(absltest.TestCase):

  def test_idx_bad_magic(self):
    path = os.path.join(self.create_tempdir().full_path, 'x-idx1-ubyte')
    with open(path, 'wb') as f:
      f.write(b'\x12\x34\x08\x01' + bytes(8))
    with self.assertRaisesRegex(source_lib.DataError, 'not an IDX file'):
      idx.read_idx(path)

  def test_read_idx_round_trip(self):
    path = os.path.join(self.create_tempdir().full_path, 'a.idx')
    array = np.arange(24, dtype='>i4').reshape(2, 3, 4)
    with open(path, 'wb') as f:
      f.write(fake_files.idx_bytes(array))
    result = idx.read_idx(path)
    np.testing.assert_array_equal(result, array)
    self.assertTrue(result.dtype.isnative)


if __name__ == '__main__':
  absltest.main()
