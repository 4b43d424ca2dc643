"""Small files in the real formats, for the loaders' tests (idx gz, JPEG tar).

Every loader's parsing path runs on files like these, so it is tested on any
machine; the real files are tested where they exist (tests/real_data.py).
"""

import gzip
import io
import os
import tarfile

import numpy as np


def idx_bytes(array: np.ndarray) -> bytes:
  """Encodes an array in IDX format (uint8 or >i4)."""
  codes = {np.dtype('u1'): 0x08, np.dtype('>i4'): 0x0C}
  header = bytes([0, 0, codes[array.dtype], array.ndim])
  header += b''.join(int(d).to_bytes(4, 'big') for d in array.shape)
  return header + array.tobytes()


def write_gz(path: str, payload: bytes) -> None:
  with gzip.open(path, 'wb') as f:
    f.write(payload)


def write_fake_idx_set(directory: str, splits=('train', 't10k'), n=6):
  """Writes tiny (Fashion-)MNIST idx files; label i for image i % 10."""
  os.makedirs(directory, exist_ok=True)
  for split in splits:
    images = (np.arange(n * 28 * 28) % 256).astype(np.uint8).reshape(n, 28, 28)
    labels = (np.arange(n) % 10).astype(np.uint8)
    write_gz(
        os.path.join(directory, f'{split}-images-idx3-ubyte.gz'),
        idx_bytes(images),
    )
    write_gz(
        os.path.join(directory, f'{split}-labels-idx1-ubyte.gz'),
        idx_bytes(labels),
    )


def jpeg(value: int) -> bytes:
  """A flat 32x32 RGB image of `value`, as JPEG at quality 100."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  image = np.full((32, 32, 3), value, np.uint8)
  return tf.io.encode_jpeg(image, quality=100).numpy()


def write_fake_cifar_tar(directory: str, names_and_blobs) -> str:
  """Writes `cifar10_jpeg.tar` with the given (member name, bytes) pairs."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, 'cifar10_jpeg.tar')
  with tarfile.open(path, 'w') as tar:
    for name, blob in names_and_blobs:
      info = tarfile.TarInfo(name)
      info.size = len(blob)
      tar.addfile(info, io.BytesIO(blob))
  return path
