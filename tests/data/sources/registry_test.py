"""Tests for tff_fair.data.sources.registry: `load_source`'s checks."""

from absl.testing import absltest
from absl.testing import parameterized

from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib


class LoadSourceTest(parameterized.TestCase):

  def test_unknown_name(self):
    with self.assertRaisesRegex(
        source_lib.DataError, r"Unknown data set 'emnist'.*Valid names: fashion"
    ):
      registry.load_source('emnist')

  def test_use_tfds_unsupported_name(self):
    with self.assertRaisesRegex(source_lib.DataError, 'use_tfds supports'):
      registry.load_source('femnist', use_tfds=True)

  @parameterized.parameters(0, -3, 2.5)
  def test_bad_max_examples(self, value):
    with self.assertRaisesRegex(source_lib.DataError, 'max_examples must be'):
      registry.load_source('digits', max_examples=value)


if __name__ == '__main__':
  absltest.main()
