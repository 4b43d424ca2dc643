"""scikit-learn's bundled 8x8 digits: a data set that needs no files."""

import numpy as np

from tff_fair.data.sources import source as source_lib

# Class names of the digit data sets (digits, MNIST, FEMNIST's first ten).
DIGIT_CLASSES = tuple(str(d) for d in range(10))


def load_digits() -> source_lib.Source:
  """Loads scikit-learn's bundled 8x8 digits (1,797 images, offline).

  There is no official split: every example has is_test=False and the
  partitioner makes the splits.
  """
  from sklearn import datasets  # pylint: disable=g-import-not-at-top

  digits = datasets.load_digits()
  images = digits.images.astype(np.float32) / np.float32(16.0)
  return source_lib.Source(
      name='digits',
      x=images[..., np.newaxis],
      y=digits.target.astype(source_lib.LABEL_DTYPE),
      num_classes=10,
      is_test=np.zeros(len(images), bool),
      metadata={'class_names': DIGIT_CLASSES},
  )
