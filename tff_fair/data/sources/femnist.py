"""FEMNIST: the partial LEAF subset in one npz, grouped by writer."""

from __future__ import annotations

import zlib

import numpy as np

from tff_fair.data.sources import digits
from tff_fair.data.sources import paths
from tff_fair.data.sources import source as source_lib

# LEAF's FEMNIST order: digits, then upper case, then lower case.
FEMNIST_CLASSES = (
    digits.DIGIT_CLASSES
    + tuple(chr(c) for c in range(ord('A'), ord('Z') + 1))
    + tuple(chr(c) for c in range(ord('a'), ord('z') + 1))
)

_FEMNIST_KEYS = (
    'x_train', 'y_train', 'writer_train',
    'x_test', 'y_test', 'writer_test', 'writer_names',
)  # pyformat: disable


def load_femnist(data_dir: str | None = None) -> source_lib.Source:
  """Loads the partial FEMNIST npz; groups are writers (105 of them).

  Args:
    data_dir: Root data directory (else `$TFF_FAIR_DATA_DIR`).
  """
  path = paths.require_file(
      paths.dataset_dir(data_dir, 'femnist'),
      'femnist_partial.npz',
      'FEMNIST',
      'Copy femnist_partial.npz from the offline data there.',
  )
  try:
    with np.load(path) as npz:
      missing = [k for k in _FEMNIST_KEYS if k not in npz.files]
      if missing:
        raise source_lib.DataError(
            f'{path} lacks the arrays {missing}; replace it with the original'
            ' femnist_partial.npz.'
        )
      d = {k: npz[k] for k in _FEMNIST_KEYS}
  except (OSError, zlib.error) as e:
    raise source_lib.DataError(
        f'Could not read {path}: {e}. Replace it with a fresh copy.'
    ) from e
  names = tuple(str(n) for n in d['writer_names'])
  return source_lib.from_train_test(
      'femnist',
      (source_lib.to_float_images(d['x_train'], 255), d['y_train']),
      (source_lib.to_float_images(d['x_test'], 255), d['y_test']),
      num_classes=len(FEMNIST_CLASSES),
      groups=np.concatenate([d['writer_train'], d['writer_test']]).astype(
          np.int64
      ),
      group_names=names,
      metadata={'class_names': FEMNIST_CLASSES},
  )
