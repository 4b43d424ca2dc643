"""MNIST from its idx files; offline usually only the 10,000 test images."""

from __future__ import annotations

import os

import numpy as np

from tff_fair.data.sources import digits
from tff_fair.data.sources import idx
from tff_fair.data.sources import paths
from tff_fair.data.sources import source as source_lib


def load_mnist(data_dir: str | None = None) -> source_lib.Source:
  """Loads MNIST from `<data_dir>/mnist`.

  Only the 10,000-image test set (t10k files) exists offline, so normally
  every example has is_test=True; the train files are used too when both are
  present. Non-natural partitions pool all examples anyway.

  Args:
    data_dir: Root data directory (else `$TFF_FAIR_DATA_DIR`).
  """
  directory = paths.dataset_dir(data_dir, 'mnist')
  hint = 'Copy the MNIST idx .gz files there or pass use_tfds=True.'
  test = idx.read_image_label_pair(
      *(paths.require_file(directory, f, 'MNIST', hint)
        for f in idx.IDX_FILE_NAMES['test'])
  )
  present = [
      os.path.isfile(os.path.join(directory, f))
      for f in idx.IDX_FILE_NAMES['train']
  ]
  if all(present):
    train = idx.read_image_label_pair(
        *(os.path.join(directory, f) for f in idx.IDX_FILE_NAMES['train'])
    )
  elif any(present):
    raise source_lib.DataError(
        f'Only one of the MNIST train files {idx.IDX_FILE_NAMES["train"]} is'
        f' in {directory}; add the other one or remove both.'
    )
  else:
    empty = np.zeros((0,) + test[0].shape[1:], np.float32)
    train = (empty, np.zeros(0, test[1].dtype))
  return source_lib.from_train_test(
      'mnist',
      train,
      test,
      num_classes=10,
      metadata={'class_names': digits.DIGIT_CLASSES},
  )
