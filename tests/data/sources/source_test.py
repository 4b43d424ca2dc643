"""Tests for tff_fair.data.sources.source: the `Source` type and subsets."""

import dataclasses

from absl.testing import absltest
import numpy as np

from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib


class OwnSourceTest(absltest.TestCase):
  """`Source(x, y, num_classes, is_test)` from a user's numpy arrays."""

  def test_positional_arrays_get_a_name_and_the_models_dtypes(self):
    x = np.zeros((4, 3, 3, 1))  # float64, numpy's default
    y = np.array([0, 1, 2, 1])  # int64
    source = source_lib.Source(x, y, 3, np.array([False, False, True, True]))
    self.assertEqual(source.name, source_lib.OWN_SOURCE_NAME)
    self.assertEqual(source.x.dtype, np.float32)
    self.assertEqual(source.y.dtype, source_lib.LABEL_DTYPE)
    tokens = source_lib.Source(np.ones((2, 5), np.int64),
                               np.zeros(2, np.int64), 2, np.zeros(2, bool),
                               name='texts')
    self.assertEqual(tokens.x.dtype, source_lib.TOKEN_DTYPE)
    self.assertEqual(tokens.name, 'texts')

  def test_float_labels_refused(self):
    with self.assertRaisesRegex(source_lib.DataError,
                                'y must hold integer class ids, got float64'):
      source_lib.Source(np.zeros((2, 3)), np.array([0.0, 1.0]), 2,
                        np.zeros(2, bool))

  def test_source_length_mismatch(self):
    with self.assertRaisesRegex(source_lib.DataError, 'same length'):
      source_lib.Source(
          name='bad',
          x=np.zeros((3, 2)),
          y=np.zeros(2, np.int32),
          num_classes=2,
          is_test=np.zeros(3, bool),
      )


class HelpersTest(absltest.TestCase):

  def test_stratified_first_k_round_robin(self):
    strata = np.array([0, 0, 0, 0, 1, 1, 2])
    np.testing.assert_array_equal(
        source_lib.stratified_first_k(strata, 3), [0, 4, 6]
    )
    np.testing.assert_array_equal(
        source_lib.stratified_first_k(strata, 5), [0, 1, 4, 5, 6]
    )
    np.testing.assert_array_equal(
        source_lib.stratified_first_k(strata, 100), np.arange(7)
    )

  def test_source_is_read_only(self):
    source = registry.load_source('digits', max_examples=10)
    with self.assertRaises(TypeError):
      source.metadata['x'] = 1  # pytype: disable=unsupported-operands
    with self.assertRaises(dataclasses.FrozenInstanceError):
      source.name = 'other'  # pytype: disable=not-writable


if __name__ == '__main__':
  absltest.main()
