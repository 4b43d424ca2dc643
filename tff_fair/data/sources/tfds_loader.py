"""Fashion-MNIST, MNIST and CIFAR-10 through TensorFlow Datasets.

`load_source(name, use_tfds=True)` takes this route instead of the files.
It needs internet only for the download: a data set TFDS has already
prepared in `data_dir` is read offline. Needs the `tfds` extra
(`tensorflow-datasets`).
"""

from __future__ import annotations

import numpy as np

from tff_fair.data.sources import cifar10
from tff_fair.data.sources import digits
from tff_fair.data.sources import fashion_mnist
from tff_fair.data.sources import source as source_lib

_IMAGE_SHAPES = {
    'fashion_mnist': (28, 28, 1),
    'mnist': (28, 28, 1),
    'cifar10': (32, 32, 3),
}
_CLASS_NAMES = {
    'fashion_mnist': fashion_mnist.FASHION_MNIST_CLASSES,
    'mnist': digits.DIGIT_CLASSES,
    'cifar10': cifar10.CIFAR10_CLASSES,
}
TFDS_SOURCE_NAMES = tuple(_IMAGE_SHAPES)


def source_from_tfds_arrays(
    name: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
) -> source_lib.Source:
  """Converts TFDS numpy (image uint8 NHWC, label) pairs into a Source.

  Kept separate from the download so it can be tested without a network.

  Args:
    name: One of `TFDS_SOURCE_NAMES`.
    train: (images, labels) of the TFDS train split.
    test: (images, labels) of the TFDS test split.
  """
  if name not in _IMAGE_SHAPES:
    raise source_lib.DataError(
        f'use_tfds supports {TFDS_SOURCE_NAMES}, not {name!r}; load'
        f' {name!r} from files instead (use_tfds=False).'
    )
  expected = _IMAGE_SHAPES[name]
  parts = []
  for split, (images, labels) in (('train', train), ('test', test)):
    images, labels = np.asarray(images), np.asarray(labels)
    if images.dtype != np.uint8 or images.shape[1:] != expected:
      raise source_lib.DataError(
          f'TFDS {name} {split} images are {images.dtype}{images.shape}, '
          f'expected uint8 (N,)+{expected}; the TFDS version is incompatible.'
      )
    if labels.shape != (len(images),):
      raise source_lib.DataError(
          f'TFDS {name} {split}: {len(images)} images but labels of shape'
          f' {labels.shape}; expected one label per image.'
      )
    parts.append((source_lib.to_float_images(images, 255), labels))
  return source_lib.from_train_test(
      name,
      parts[0],
      parts[1],
      num_classes=len(_CLASS_NAMES[name]),
      metadata={'class_names': _CLASS_NAMES[name]},
  )


def load_with_tfds(name: str, data_dir: str | None) -> source_lib.Source:
  """Loads a TFDS data set, downloading it unless `data_dir` has it prepared.

  Needs internet only for the download: a data set TFDS has already prepared
  in `data_dir` (downloaded before, or built from local files with
  `download_and_prepare`) is read offline.

  Args:
    name: One of `TFDS_SOURCE_NAMES`.
    data_dir: TFDS's data_dir, or None for its default.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  train, test = tfds.as_numpy(
      tfds.load(
          name,
          split=['train', 'test'],
          batch_size=-1,
          as_supervised=True,
          data_dir=data_dir or None,
      )
  )
  return source_from_tfds_arrays(name, train, test)
