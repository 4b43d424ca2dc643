"""The atomic write helper: text and binary files, nothing left on failure."""

import csv
import os

from absl.testing import absltest
import numpy as np

from tff_fair import files


class WriteAtomicallyTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.folder = self.create_tempdir().full_path

  def test_text_replaces_the_file_and_keeps_csv_newlines(self):
    path = os.path.join(self.folder, 'table.csv')
    files.write_atomically(path, lambda f: f.write('old'))
    files.write_atomically(
        path, lambda f: csv.writer(f).writerows([['a', 'b'], ['1', '2']]))
    with open(path, 'rb') as f:
      self.assertEqual(f.read(), b'a,b\r\n1,2\r\n')  # csv's own line ends.
    self.assertEqual(os.listdir(self.folder), ['table.csv'])

  def test_binary_and_missing_folders(self):
    path = os.path.join(self.folder, 'cache', 'deeper', 'arrays.npz')
    files.write_atomically(path, lambda f: np.savez(f, a=np.arange(3)),
                           binary=True)
    with np.load(path) as saved:
      np.testing.assert_array_equal(saved['a'], [0, 1, 2])

  def test_failed_write_keeps_the_old_file_and_no_temporary(self):
    path = os.path.join(self.folder, 'config.json')
    files.write_atomically(path, lambda f: f.write('{}'))

    def fail(f):
      f.write('{"half": ')
      raise RuntimeError('killed')

    with self.assertRaisesRegex(RuntimeError, 'killed'):
      files.write_atomically(path, fail)
    with open(path) as f:
      self.assertEqual(f.read(), '{}')
    self.assertEqual(os.listdir(self.folder), ['config.json'])


if __name__ == '__main__':
  absltest.main()
