"""CIFAR-10 (50,000 train + 10,000 test) from `cifar10_jpeg.tar`.

The tar holds one JPEG per image, `train|test/<class>/<NNNN>.jpg`. The full
decode is cached (`cache`); with `max_examples` only the selected JPEGs are
decoded and nothing is cached (tests use this to stay fast).
"""

from __future__ import annotations

from collections.abc import Sequence
import tarfile

import numpy as np

from tff_fair.data.sources import cache
from tff_fair.data.sources import paths
from tff_fair.data.sources import source as source_lib

CIFAR10_CLASSES = (
    'airplane', 'automobile', 'bird', 'cat', 'deer',
    'dog', 'frog', 'horse', 'ship', 'truck',
)  # pyformat: disable

_CACHE_VERSION = 1
_CACHED_ARRAYS = ('images', 'labels', 'is_test')


def _parse_member(name: str, tar_path: str) -> tuple[bool, int]:
  """Maps 'train/<class>/<NNNN>.jpg' to (is_test, label)."""
  parts = name.split('/')
  if (
      len(parts) != 3
      or parts[0] not in ('train', 'test')
      or parts[1] not in CIFAR10_CLASSES
  ):
    raise source_lib.DataError(
        f'Unexpected member {name!r} in {tar_path}; expected'
        ' train|test/<class>/<NNNN>.jpg with a CIFAR-10 class name. Replace'
        ' the tar with the original cifar10_jpeg.tar.'
    )
  return parts[0] == 'test', CIFAR10_CLASSES.index(parts[1])


def decode_jpegs(blobs: Sequence[bytes], image_shape=(32, 32, 3)) -> np.ndarray:
  """Decodes JPEG byte strings to a uint8 array with TensorFlow.

  Uses a parallel tf.data pipeline because eager per-image calls are several
  times slower for tens of thousands of tiny images.

  Args:
    blobs: JPEG files' bytes.
    image_shape: Expected (height, width, channels) of every image.

  Returns:
    uint8 array (len(blobs),) + image_shape.

  Raises:
    DataError: if an image cannot be decoded or has another shape.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if not blobs:
    return np.zeros((0,) + tuple(image_shape), np.uint8)
  channels = image_shape[-1]
  dataset = (
      tf.data.Dataset.from_tensor_slices(tf.constant(list(blobs), tf.string))
      .map(
          # ensure_shape turns a wrong-sized image into an error here instead
          # of a silently mis-stacked batch. INTEGER_ACCURATE is libjpeg's
          # default (ISLOW), which Pillow also uses; TF's own default (IFAST)
          # shifts the red/blue means by ~0.005 from the README's values.
          lambda b: tf.ensure_shape(
              tf.io.decode_jpeg(
                  b, channels=channels, dct_method='INTEGER_ACCURATE'
              ),
              image_shape,
          ),
          num_parallel_calls=tf.data.AUTOTUNE,
          deterministic=True,
      )
      .batch(2048)
  )
  try:
    batches = [b.numpy() for b in dataset]
  except tf.errors.OpError as e:
    raise source_lib.DataError(
        f'A JPEG could not be decoded to shape {tuple(image_shape)}'
        f' ({e.message}); the CIFAR-10 tar is corrupt. Replace it with a'
        ' fresh copy.'
    ) from e
  return np.concatenate(batches)


def _cache_path(tar_path: str, cache_dir: str | None) -> str:
  return cache.cache_path(cache_dir, 'cifar10', _CACHE_VERSION, tar_path)


def load_cifar10(
    data_dir: str | None = None,
    *,
    max_examples: int | None = None,
    cache_dir: str | None = None,
) -> source_lib.Source:
  """Loads CIFAR-10 (50,000 train + 10,000 test) from `cifar10_jpeg.tar`.

  The full decode is cached as an .npz keyed by the tar's size and mtime.
  With `max_examples` only the selected JPEGs are decoded and nothing is
  cached (tests use this to stay fast).

  Args:
    data_dir: Root data directory (else `$TFF_FAIR_DATA_DIR`).
    max_examples: Keep only a stratified subset of this size.
    cache_dir: Directory for the decoded-array cache; see `cache`.
  """
  source_lib.check_max_examples(max_examples)
  tar_path = paths.require_file(
      paths.dataset_dir(data_dir, 'cifar10'),
      'cifar10_jpeg.tar',
      'CIFAR-10',
      'Copy cifar10_jpeg.tar there or pass use_tfds=True with internet'
      ' access.',
  )
  cache_path = _cache_path(tar_path, cache_dir)
  arrays = (cache.read(cache_path, _CACHED_ARRAYS) if max_examples is None
            else None)
  if arrays is None:
    arrays = _decode_tar(tar_path, max_examples)
    if max_examples is None:
      cache.write(cache_path, arrays)
  return source_lib.Source(
      name='cifar10',
      x=source_lib.to_float_images(arrays['images'], 255),
      y=arrays['labels'].astype(source_lib.LABEL_DTYPE),
      num_classes=10,
      is_test=arrays['is_test'].astype(bool),
      metadata={'class_names': CIFAR10_CLASSES},
  )


def _decode_tar(
    tar_path: str, max_examples: int | None
) -> dict[str, np.ndarray]:
  """Reads and decodes the tar; train members first, then test."""
  try:
    with tarfile.open(tar_path) as tar:
      members = [m for m in tar if m.isfile()]
      meta = [_parse_member(m.name, tar_path) for m in members]
      is_test = np.array([t for t, _ in meta], bool)
      labels = np.array([c for _, c in meta], source_lib.LABEL_DTYPE)
      # Train before test regardless of member order in the tar.
      order = np.argsort(is_test, kind='stable')
      if max_examples is not None:
        keep = source_lib.stratified_first_k(
            is_test[order].astype(np.int64) * 10 + labels[order], max_examples
        )
        order = order[keep]
      blobs = [tar.extractfile(members[i]).read() for i in order]
  except (tarfile.TarError, OSError, EOFError) as e:
    raise source_lib.DataError(
        f'Could not read {tar_path}: {e}. The tar is corrupt or truncated;'
        ' replace it with a fresh copy.'
    ) from e
  return {
      'images': decode_jpegs(blobs),
      'labels': labels[order],
      'is_test': is_test[order],
  }
