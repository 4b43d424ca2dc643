"""The IDX format of MNIST and Fashion-MNIST (optionally gzip-compressed)."""

from __future__ import annotations

import gzip
import zlib

import numpy as np

from tff_fair.data.sources import source as source_lib

# The files of each split, in the names both data sets use.
IDX_FILE_NAMES = {
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
    'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}

_IDX_DTYPES = {
    0x08: np.dtype('u1'),
    0x09: np.dtype('i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}


def read_idx(path: str) -> np.ndarray:
  """Reads an IDX file (optionally gzip-compressed) into a numpy array.

  The magic number and the payload length are checked against the header, so
  a truncated or corrupt file gives an error naming the file rather than a
  silent short array.

  Args:
    path: File path; a `.gz` suffix means gzip.

  Returns:
    Array with the header's shape and the native-endian version of its dtype.

  Raises:
    DataError: on a missing, undecompressable, malformed or truncated file.
  """
  fix = (
      'The file is corrupt or truncated; replace it with a fresh copy (for'
      ' Fashion-MNIST reinstall the Debian package dataset-fashion-mnist).'
  )
  try:
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rb') as f:
      data = f.read()
  except FileNotFoundError as e:
    raise source_lib.DataError(f'IDX file {path} not found.') from e
  except (OSError, EOFError, zlib.error) as e:
    raise source_lib.DataError(
        f'Could not decompress {path}: {e}. {fix}') from e
  if len(data) < 4 or data[0] != 0 or data[1] != 0:
    raise source_lib.DataError(
        f'{path} is not an IDX file (bad magic number {data[:4].hex()}). {fix}'
    )
  type_code, ndim = data[2], data[3]
  if type_code not in _IDX_DTYPES or ndim == 0:
    raise source_lib.DataError(
        f'{path} has an unsupported IDX header (type 0x{type_code:02x}, {ndim}'
        f' dimensions). {fix}'
    )
  header_len = 4 + 4 * ndim
  if len(data) < header_len:
    raise source_lib.DataError(f'{path} ends inside its IDX header. {fix}')
  shape = tuple(
      int.from_bytes(data[4 + 4 * i : 8 + 4 * i], 'big') for i in range(ndim)
  )
  dtype = _IDX_DTYPES[type_code]
  expected = header_len + int(np.prod(shape)) * dtype.itemsize
  if len(data) != expected:
    raise source_lib.DataError(
        f'{path} holds {len(data)} bytes but its IDX header {shape} needs'
        f' {expected}. {fix}'
    )
  array = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(shape)
  return array.astype(dtype.newbyteorder('='))


def read_image_label_pair(
    images_path: str, labels_path: str
) -> tuple[np.ndarray, np.ndarray]:
  """Reads an images file and its labels file: float32 images in [0, 1]."""
  images, labels = read_idx(images_path), read_idx(labels_path)
  if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
    raise source_lib.DataError(
        f'{images_path} ({images.shape}) and {labels_path} ({labels.shape})'
        ' do not form an image/label pair; check that the files belong'
        ' together.'
    )
  return source_lib.to_float_images(images, 255), labels
