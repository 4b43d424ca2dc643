"""Tests for tff_fair.data.sources.digits (scikit-learn's bundled digits)."""

from absl.testing import absltest
import numpy as np

from tff_fair.data.sources import registry


class DigitsTest(absltest.TestCase):

  def test_digits(self):
    source = registry.load_source('digits')
    self.assertEqual(source.x.shape, (1797, 8, 8, 1))
    self.assertEqual(source.x.dtype, np.float32)
    self.assertEqual(float(source.x.max()), 1.0)
    self.assertFalse(source.is_test.any())
    self.assertEqual(source.num_classes, 10)


if __name__ == '__main__':
  absltest.main()
