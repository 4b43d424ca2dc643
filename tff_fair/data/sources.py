"""Loaders that turn the offline benchmark files into pooled `Source` arrays.

A `Source` holds every example of one data set in memory, the source's own
train split first and its test split after it, with a boolean `is_test` flag
per example. Partitioning into clients happens later (see `partition.py` and
`federated.py`); loaders never split or shuffle.

Where the files are looked up:

* `data_dir` argument if given, else the environment variable
  `TFF_FAIR_DATA_DIR`. Inside it each data set has its own directory with
  the file names of the shared offline data:

  ```
  <data_dir>/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
  <data_dir>/mnist/t10k-{images-idx3,labels-idx1}-ubyte.gz  (+ train-* optional)
  <data_dir>/cifar10/cifar10_jpeg.tar
  <data_dir>/femnist/femnist_partial.npz
  <data_dir>/shakespeare/shakespeare_{train,test}.h5
  <data_dir>/sst2/stsa.binary.{train,dev,test}
  ```

* Fashion-MNIST is usually installed system-wide, so its directory is the
  first of these that exists: `<data_dir>/fashion-mnist` when `data_dir` is
  passed explicitly (an explicit argument beats the environment), the
  environment variable `TFF_FAIR_FASHION_MNIST_DIR`,
  `$TFF_FAIR_DATA_DIR/fashion-mnist`, and `/usr/share/datasets/fashion-mnist`
  (Debian package `dataset-fashion-mnist`).
* `digits` is scikit-learn's bundled `load_digits` and needs no files.
* Decoded CIFAR-10 arrays are cached in `cache_dir`, else
  `TFF_FAIR_CACHE_DIR`, else `~/.cache/tff_fair`.

Conventions shared by all sources:

* Images are float32 in [0, 1] with a channel axis: (N, 28, 28, 1) for
  fashion_mnist, mnist and femnist (ink high), (N, 32, 32, 3) for cifar10,
  (N, 8, 8, 1) for digits (raw 0..16 values divided by 16).
* Labels are int32 everywhere (`LABEL_DTYPE`): class ids of shape (N,) for
  classification, next-character ids of shape (N, sequence_length) for
  Shakespeare. int32 is what Keras sparse losses and TFF specs accept without
  casts and is wide enough for every vocabulary here.
* Token inputs (Shakespeare, SST-2) are int32 ids with 0 as padding.
* `max_examples` keeps a deterministic, stratified subset: the first k
  examples of every stratum taken round-robin, where a stratum is (split,
  group) for sources with natural groups and (split, class) otherwise. It
  exists so tests can load a few hundred examples in well under a second.

Facts about the individual files (counts, orders, encodings) are in the
README that ships with the offline data.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import gzip
import os
import tarfile
import types
from typing import Any
import zlib

from absl import logging
import numpy as np

from tff_fair import errors
from tff_fair import files

DATA_DIR_ENV = 'TFF_FAIR_DATA_DIR'
FASHION_MNIST_DIR_ENV = 'TFF_FAIR_FASHION_MNIST_DIR'
CACHE_DIR_ENV = 'TFF_FAIR_CACHE_DIR'
SYSTEM_FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
DEFAULT_CACHE_DIR = os.path.join('~', '.cache', 'tff_fair')

LABEL_DTYPE = np.int32
TOKEN_DTYPE = np.int32

SOURCE_NAMES = (
    'fashion_mnist',
    'mnist',
    'cifar10',
    'femnist',
    'shakespeare',
    'sst2',
    'digits',
)
TFDS_SOURCE_NAMES = ('fashion_mnist', 'mnist', 'cifar10')
# The name of a Source built from your own arrays unless you give one.
OWN_SOURCE_NAME = 'own_data'

FASHION_MNIST_CLASSES = (
    'T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat',
    'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot',
)  # pyformat: disable
DIGIT_CLASSES = tuple(str(d) for d in range(10))
CIFAR10_CLASSES = (
    'airplane', 'automobile', 'bird', 'cat', 'deer',
    'dog', 'frog', 'horse', 'ship', 'truck',
)  # pyformat: disable
# LEAF's FEMNIST order: digits, then upper case, then lower case.
FEMNIST_CLASSES = (
    DIGIT_CLASSES
    + tuple(chr(c) for c in range(ord('A'), ord('Z') + 1))
    + tuple(chr(c) for c in range(ord('a'), ord('z') + 1))
)
SST2_CLASSES = ('negative', 'positive')

# TFF's Shakespeare character vocabulary, copied from
# tensorflow_federated/python/simulation/baselines/shakespeare/
# char_prediction_preprocessing.py (CHAR_VOCAB) so that token ids match TFF's
# baseline task; sources_test checks the copy against the installed TFF.
# Copied rather than imported to keep this module free of a TFF import and of
# a dependency on a private TFF module path.
SHAKESPEARE_CHAR_VOCAB = tuple(
    'dhlptx@DHLPTX'
    ' $(,048cgkoswCGKOSW[_#\'/37;?bfjnrvzBFJNRVZ"&*.26:\n'
    'aeimquyAEIMQUY]!%)-159\r'
)
# Special ids as in TFF's get_special_tokens(): characters take 1..86.
SHAKESPEARE_PAD_ID = 0
SHAKESPEARE_OOV_ID = len(SHAKESPEARE_CHAR_VOCAB) + 1
SHAKESPEARE_BOS_ID = len(SHAKESPEARE_CHAR_VOCAB) + 2
SHAKESPEARE_EOS_ID = len(SHAKESPEARE_CHAR_VOCAB) + 3
SHAKESPEARE_VOCAB_SIZE = len(SHAKESPEARE_CHAR_VOCAB) + 4  # 90, TFF's value.
SHAKESPEARE_SEQUENCE_LENGTH = 80  # TFF's DEFAULT_SEQUENCE_LENGTH.

SST2_MAX_LEN = 50
SST2_PAD_ID = 0
SST2_OOV_ID = 1

_CIFAR10_CACHE_VERSION = 1
_IDX_DTYPES = {
    0x08: np.dtype('u1'),
    0x09: np.dtype('i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}


class DataError(errors.UserError, ValueError):
  """A data file is missing, malformed or a request cannot be satisfied."""


@dataclasses.dataclass(frozen=True, eq=False)
class Source:
  """All examples of one data set, pooled (own train split first, then test).

  Your own data is `Source(x, y, num_classes, is_test)` (optionally with a
  `name`); the loaders build theirs the same way. Float inputs become
  float32, integer inputs (token ids) and labels int32: the dtypes of the
  models' input specs.

  Attributes:
    x: Inputs, first axis = example.
    y: int32 labels: (N,) class ids for classification, (N, seq_len)
      next-token targets for Shakespeare.
    num_classes: Number of classes; vocabulary size for Shakespeare.
    is_test: bool (N,), True for examples of the source's own test split.
    name: One of `SOURCE_NAMES` for the loaders' data sets (it picks their
      default model and settings); any other name for your own data.
    groups: int (N,) natural client index (FEMNIST writer, Shakespeare role)
      into `group_names`, or None when the source has no natural clients.
    group_names: Name of each group, or None.
    metadata: Read-only extra facts, e.g. `class_names`, `num_tokens` (SST-2
      vocabulary size) or the Shakespeare special ids.
  """

  x: np.ndarray
  y: np.ndarray
  num_classes: int
  is_test: np.ndarray
  # After the arrays, so own data needs no name: Source(x, y, k, is_test).
  name: str = OWN_SOURCE_NAME
  groups: np.ndarray | None = None
  group_names: tuple[str, ...] | None = None
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    n = len(self.x)
    # Catch loader bugs early: every array must describe the same examples.
    if len(self.y) != n or len(self.is_test) != n:
      raise DataError(
          f'Source {self.name!r}: x has {n} examples but y has {len(self.y)}'
          f' and is_test {len(self.is_test)}; all must have the same length.'
      )
    if self.is_test.dtype != np.bool_:
      raise DataError(
          f'Source {self.name!r}: is_test must be bool, got'
          f' {self.is_test.dtype}; pass a boolean mask.'
      )
    if (self.groups is None) != (self.group_names is None):
      raise DataError(
          f'Source {self.name!r}: groups and group_names must both be set or'
          ' both be None.'
      )
    if self.groups is not None:
      if len(self.groups) != n:
        raise DataError(
            f'Source {self.name!r}: groups has {len(self.groups)} entries for'
            f' {n} examples; give one group index per example.'
        )
      if n and (
          self.groups.min() < 0 or self.groups.max() >= len(self.group_names)
      ):
        raise DataError(
            f'Source {self.name!r}: group indices must lie in'
            f' [0, {len(self.group_names)}); fix the group index array.'
        )
    if self.y.dtype.kind not in 'iu':
      raise DataError(
          f'Source {self.name!r}: y must hold integer class ids, got'
          f' {self.y.dtype}; convert it, e.g. y.astype(np.int32).'
      )
    if self.y.ndim == 1 and n and (
        self.y.min() < 0 or self.y.max() >= self.num_classes
    ):
      raise DataError(
          f'Source {self.name!r}: labels must lie in [0, {self.num_classes}),'
          f' got [{self.y.min()}, {self.y.max()}]; fix num_classes or y.'
      )
    # Own arrays often come as numpy's int64 / float64; the models' TFF
    # input specs take int32 labels and float32 inputs or int32 token ids.
    x_dtype = np.float32 if self.x.dtype.kind == 'f' else TOKEN_DTYPE
    if self.x.dtype.kind in 'fiu' and self.x.dtype != x_dtype:
      object.__setattr__(self, 'x', self.x.astype(x_dtype))
    if self.y.dtype != LABEL_DTYPE:
      object.__setattr__(self, 'y', self.y.astype(LABEL_DTYPE))
    # A MappingProxy keeps the metadata of a frozen Source from being edited.
    object.__setattr__(
        self, 'metadata', types.MappingProxyType(dict(self.metadata))
    )

  @property
  def num_examples(self) -> int:
    return len(self.x)

  @property
  def has_class_labels(self) -> bool:
    """True when `y` holds one class id per example (not a sequence)."""
    return self.y.ndim == 1

  def take(self, indices: np.ndarray) -> Source:
    """Returns a new Source with only the examples at `indices`, in order.

    Args:
      indices: Integer positions into this source.
    """
    indices = np.asarray(indices, dtype=np.int64)
    return dataclasses.replace(
        self,
        x=self.x[indices],
        y=self.y[indices],
        is_test=self.is_test[indices],
        groups=None if self.groups is None else self.groups[indices],
    )


# ----------------------------------------------------------------------------
# Directory resolution.
# ----------------------------------------------------------------------------


def resolve_data_dir(data_dir: str | None) -> str:
  """Returns the root data directory: `data_dir`, else `$TFF_FAIR_DATA_DIR`.

  Args:
    data_dir: Explicit directory or None.

  Raises:
    DataError: if neither is set or the directory does not exist.
  """
  root = data_dir if data_dir else os.environ.get(DATA_DIR_ENV)
  if not root:
    raise DataError(
        'No data directory given. Pass data_dir=... or set the environment'
        f' variable {DATA_DIR_ENV} to the directory that holds mnist/,'
        ' cifar10/, femnist/, shakespeare/ and sst2/.'
    )
  root = os.path.expanduser(root)
  if os.path.exists(root) and not os.path.isdir(root):
    raise DataError(
        f'Data directory {root} is a file, not a directory. Pass data_dir=...'
        f' or set {DATA_DIR_ENV} to the directory holding the data sets.'
    )
  if not os.path.isdir(root):
    raise DataError(
        f'Data directory {root} does not exist. Pass data_dir=... or set'
        f' {DATA_DIR_ENV} to an existing directory holding the data sets.'
    )
  return root


def fashion_mnist_dir_candidates(data_dir: str | None) -> list[str]:
  """Returns the Fashion-MNIST directories to try, most specific first."""
  candidates = []
  if data_dir:
    candidates.append(os.path.join(data_dir, 'fashion-mnist'))
  if os.environ.get(FASHION_MNIST_DIR_ENV):
    candidates.append(os.environ[FASHION_MNIST_DIR_ENV])
  if os.environ.get(DATA_DIR_ENV):
    candidates.append(os.path.join(os.environ[DATA_DIR_ENV], 'fashion-mnist'))
  candidates.append(SYSTEM_FASHION_MNIST_DIR)
  return [os.path.expanduser(c) for c in candidates]


def resolve_cache_dir(cache_dir: str | None) -> str:
  """Returns `cache_dir`, else `$TFF_FAIR_CACHE_DIR`, else ~/.cache/tff_fair."""
  root = cache_dir or os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR
  return os.path.expanduser(root)


def _dataset_dir(data_dir: str | None, subdir: str) -> str:
  path = os.path.join(resolve_data_dir(data_dir), subdir)
  if not os.path.isdir(path):
    raise DataError(
        f'Directory {path} not found. Put the {subdir} files there (see the'
        f' module docstring of {__name__} for the layout) or point data_dir'
        f' / {DATA_DIR_ENV} at the directory that contains {subdir}/.'
    )
  return path


def _require_file(
    directory: str, filename: str, label: str, hint: str
) -> str:
  """Returns directory/filename or raises an error saying how to fix it."""
  path = os.path.join(directory, filename)
  if not os.path.isfile(path):
    raise DataError(f'{label} file {filename} not found in {directory}. {hint}')
  return path


# ----------------------------------------------------------------------------
# Small shared helpers.
# ----------------------------------------------------------------------------


def _to_float_images(images: np.ndarray, max_value: float) -> np.ndarray:
  """Scales integer images to float32 [0, 1] and adds a channel axis if 3-D."""
  x = images.astype(np.float32) / np.float32(max_value)
  return x[..., np.newaxis] if x.ndim == 3 else x


def stratified_first_k(strata: np.ndarray, k: int) -> np.ndarray:
  """Picks k positions, round-robin over strata, first ones of each stratum.

  Deterministic and cheap: no random numbers, so a test subset is the same
  on every machine. Strata are served in order of their smallest key.

  Args:
    strata: Integer stratum key per example, shape (N,).
    k: Number of positions to keep (k >= N keeps everything).

  Returns:
    Sorted int64 positions.
  """
  strata = np.asarray(strata)
  n = len(strata)
  if k >= n:
    return np.arange(n, dtype=np.int64)
  _, inverse = np.unique(strata, return_inverse=True)
  order = np.argsort(inverse, kind='stable')
  counts = np.bincount(inverse)
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  rank = np.empty(n, dtype=np.int64)
  rank[order] = np.arange(n) - np.repeat(starts, counts)
  # Primary key rank, secondary key stratum: everyone's 1st, then 2nd, ...
  chosen = np.lexsort((inverse, rank))[:k]
  return np.sort(chosen).astype(np.int64)


def subsample(source: Source, max_examples: int | None) -> Source:
  """Returns `source` cut to `max_examples` with `stratified_first_k`.

  Strata are (split, group) when the source has groups, so every natural
  client keeps examples, and (split, class) for classification otherwise.

  Args:
    source: The full source.
    max_examples: Maximum number of examples, or None for all.
  """
  _check_max_examples(max_examples)
  if max_examples is None or max_examples >= source.num_examples:
    return source
  split = source.is_test.astype(np.int64)
  if source.groups is not None:
    strata = split * len(source.group_names) + source.groups
  elif source.has_class_labels:
    strata = split * source.num_classes + source.y
  else:
    strata = split
  return source.take(stratified_first_k(strata, max_examples))


def _check_max_examples(max_examples: int | None) -> None:
  if max_examples is not None and (
      isinstance(max_examples, bool)
      or not isinstance(max_examples, (int, np.integer))
      or max_examples < 1
  ):
    raise DataError(
        f'max_examples must be a positive integer or None, got'
        f' {max_examples!r}.'
    )


def _split_source(
    name: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    num_classes: int,
    **kwargs,
) -> Source:
  """Builds a Source from (x, y) train and test parts, train first."""
  x = np.concatenate([train[0], test[0]])
  y = np.concatenate([train[1], test[1]]).astype(LABEL_DTYPE)
  is_test = np.concatenate(
      [np.zeros(len(train[0]), bool), np.ones(len(test[0]), bool)]
  )
  return Source(
      name=name, x=x, y=y, num_classes=num_classes, is_test=is_test, **kwargs
  )


# ----------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST).
# ----------------------------------------------------------------------------


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
    raise DataError(f'IDX file {path} not found.') from e
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(f'Could not decompress {path}: {e}. {fix}') from e
  if len(data) < 4 or data[0] != 0 or data[1] != 0:
    raise DataError(
        f'{path} is not an IDX file (bad magic number {data[:4].hex()}). {fix}'
    )
  type_code, ndim = data[2], data[3]
  if type_code not in _IDX_DTYPES or ndim == 0:
    raise DataError(
        f'{path} has an unsupported IDX header (type 0x{type_code:02x}, {ndim}'
        f' dimensions). {fix}'
    )
  header_len = 4 + 4 * ndim
  if len(data) < header_len:
    raise DataError(f'{path} ends inside its IDX header. {fix}')
  shape = tuple(
      int.from_bytes(data[4 + 4 * i : 8 + 4 * i], 'big') for i in range(ndim)
  )
  dtype = _IDX_DTYPES[type_code]
  expected = header_len + int(np.prod(shape)) * dtype.itemsize
  if len(data) != expected:
    raise DataError(
        f'{path} holds {len(data)} bytes but its IDX header {shape} needs'
        f' {expected}. {fix}'
    )
  array = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(shape)
  return array.astype(dtype.newbyteorder('='))


def _read_idx_pair(
    images_path: str, labels_path: str
) -> tuple[np.ndarray, np.ndarray]:
  images, labels = read_idx(images_path), read_idx(labels_path)
  if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
    raise DataError(
        f'{images_path} ({images.shape}) and {labels_path} ({labels.shape})'
        ' do not form an image/label pair; check that the files belong'
        ' together.'
    )
  return _to_float_images(images, 255), labels


IDX_FILE_NAMES = {
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
    'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}


def load_fashion_mnist(data_dir: str | None = None) -> Source:
  """Loads Fashion-MNIST (60,000 train + 10,000 test) from its idx files.

  Args:
    data_dir: Root data directory; see the module docstring for how the
      Fashion-MNIST directory is found.
  """
  candidates = fashion_mnist_dir_candidates(data_dir)
  directory = next((c for c in candidates if os.path.isdir(c)), candidates[-1])
  hint = (
      'Install the Debian package (apt-get install dataset-fashion-mnist),'
      f' set {FASHION_MNIST_DIR_ENV}, or pass use_tfds=True with internet'
      f' access. Directories tried in order: {", ".join(candidates)}.'
  )
  parts = {}
  for split, (images, labels) in IDX_FILE_NAMES.items():
    parts[split] = _read_idx_pair(
        _require_file(directory, images, 'Fashion-MNIST', hint),
        _require_file(directory, labels, 'Fashion-MNIST', hint),
    )
  return _split_source(
      'fashion_mnist',
      parts['train'],
      parts['test'],
      num_classes=10,
      metadata={'class_names': FASHION_MNIST_CLASSES, 'directory': directory},
  )


def load_mnist(data_dir: str | None = None) -> Source:
  """Loads MNIST from `<data_dir>/mnist`.

  Only the 10,000-image test set (t10k files) exists offline, so normally
  every example has is_test=True; the train files are used too when both are
  present. Non-natural partitions pool all examples anyway.

  Args:
    data_dir: Root data directory (else `$TFF_FAIR_DATA_DIR`).
  """
  directory = _dataset_dir(data_dir, 'mnist')
  hint = 'Copy the MNIST idx .gz files there or pass use_tfds=True.'
  test = _read_idx_pair(
      *(_require_file(directory, f, 'MNIST', hint)
        for f in IDX_FILE_NAMES['test'])
  )
  present = [
      os.path.isfile(os.path.join(directory, f))
      for f in IDX_FILE_NAMES['train']
  ]
  if all(present):
    train = _read_idx_pair(
        *(os.path.join(directory, f) for f in IDX_FILE_NAMES['train'])
    )
  elif any(present):
    raise DataError(
        f'Only one of the MNIST train files {IDX_FILE_NAMES["train"]} is in'
        f' {directory}; add the other one or remove both.'
    )
  else:
    empty = np.zeros((0,) + test[0].shape[1:], np.float32)
    train = (empty, np.zeros(0, test[1].dtype))
  return _split_source(
      'mnist',
      train,
      test,
      num_classes=10,
      metadata={'class_names': DIGIT_CLASSES},
  )


# ----------------------------------------------------------------------------
# CIFAR-10 (JPEG tar).
# ----------------------------------------------------------------------------


def _parse_cifar_member(name: str, tar_path: str) -> tuple[bool, int]:
  """Maps 'train/<class>/<NNNN>.jpg' to (is_test, label)."""
  parts = name.split('/')
  if (
      len(parts) != 3
      or parts[0] not in ('train', 'test')
      or parts[1] not in CIFAR10_CLASSES
  ):
    raise DataError(
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
    raise DataError(
        f'A JPEG could not be decoded to shape {tuple(image_shape)}'
        f' ({e.message}); the CIFAR-10 tar is corrupt. Replace it with a'
        ' fresh copy.'
    ) from e
  return np.concatenate(batches)


def _cifar_cache_path(tar_path: str, cache_dir: str) -> str:
  stat = os.stat(tar_path)
  # Size + mtime identify the tar cheaply; the version guards format changes.
  return os.path.join(
      cache_dir,
      f'cifar10_v{_CIFAR10_CACHE_VERSION}_{stat.st_size}_'
      f'{stat.st_mtime_ns}.npz',
  )


def _read_cifar_cache(path: str) -> dict[str, np.ndarray] | None:
  if not os.path.isfile(path):
    return None
  try:
    with np.load(path) as cached:
      arrays = {k: cached[k] for k in ('images', 'labels', 'is_test')}
  except (OSError, ValueError, KeyError, zlib.error) as e:
    # A broken cache is only a lost speed-up: decode again and overwrite it.
    logging.warning('Ignoring unreadable CIFAR-10 cache %s: %s', path, e)
    return None
  return arrays


def load_cifar10(
    data_dir: str | None = None,
    *,
    max_examples: int | None = None,
    cache_dir: str | None = None,
) -> Source:
  """Loads CIFAR-10 (50,000 train + 10,000 test) from `cifar10_jpeg.tar`.

  The full decode is cached as an .npz keyed by the tar's size and mtime.
  With `max_examples` only the selected JPEGs are decoded and nothing is
  cached (tests use this to stay fast).

  Args:
    data_dir: Root data directory (else `$TFF_FAIR_DATA_DIR`).
    max_examples: Keep only a stratified subset of this size.
    cache_dir: Directory for the decoded-array cache; see the module docstring.
  """
  _check_max_examples(max_examples)
  tar_path = _require_file(
      _dataset_dir(data_dir, 'cifar10'),
      'cifar10_jpeg.tar',
      'CIFAR-10',
      'Copy cifar10_jpeg.tar there or pass use_tfds=True with internet'
      ' access.',
  )
  cache_path = _cifar_cache_path(tar_path, resolve_cache_dir(cache_dir))
  arrays = _read_cifar_cache(cache_path) if max_examples is None else None
  if arrays is None:
    arrays = _decode_cifar_tar(tar_path, max_examples)
    if max_examples is None:
      try:
        files.write_atomically(
            cache_path, lambda f: np.savez(f, **arrays), binary=True)
      except OSError as e:
        logging.warning('Could not write CIFAR-10 cache %s: %s', cache_path, e)
  return Source(
      name='cifar10',
      x=_to_float_images(arrays['images'], 255),
      y=arrays['labels'].astype(LABEL_DTYPE),
      num_classes=10,
      is_test=arrays['is_test'].astype(bool),
      metadata={'class_names': CIFAR10_CLASSES},
  )


def _decode_cifar_tar(
    tar_path: str, max_examples: int | None
) -> dict[str, np.ndarray]:
  """Reads and decodes the tar; train members first, then test."""
  try:
    with tarfile.open(tar_path) as tar:
      members = [m for m in tar if m.isfile()]
      meta = [_parse_cifar_member(m.name, tar_path) for m in members]
      is_test = np.array([t for t, _ in meta], bool)
      labels = np.array([c for _, c in meta], LABEL_DTYPE)
      # Train before test regardless of member order in the tar.
      order = np.argsort(is_test, kind='stable')
      if max_examples is not None:
        keep = stratified_first_k(
            is_test[order].astype(np.int64) * 10 + labels[order], max_examples
        )
        order = order[keep]
      blobs = [tar.extractfile(members[i]).read() for i in order]
  except (tarfile.TarError, OSError, EOFError) as e:
    raise DataError(
        f'Could not read {tar_path}: {e}. The tar is corrupt or truncated;'
        ' replace it with a fresh copy.'
    ) from e
  return {
      'images': decode_jpegs(blobs),
      'labels': labels[order],
      'is_test': is_test[order],
  }


# ----------------------------------------------------------------------------
# FEMNIST (LEAF subset by writer).
# ----------------------------------------------------------------------------

_FEMNIST_KEYS = (
    'x_train', 'y_train', 'writer_train',
    'x_test', 'y_test', 'writer_test', 'writer_names',
)  # pyformat: disable


def load_femnist(data_dir: str | None = None) -> Source:
  """Loads the partial FEMNIST npz; groups are writers (105 of them).

  Args:
    data_dir: Root data directory (else `$TFF_FAIR_DATA_DIR`).
  """
  path = _require_file(
      _dataset_dir(data_dir, 'femnist'),
      'femnist_partial.npz',
      'FEMNIST',
      'Copy femnist_partial.npz from the offline data there.',
  )
  try:
    with np.load(path) as npz:
      missing = [k for k in _FEMNIST_KEYS if k not in npz.files]
      if missing:
        raise DataError(
            f'{path} lacks the arrays {missing}; replace it with the original'
            ' femnist_partial.npz.'
        )
      d = {k: npz[k] for k in _FEMNIST_KEYS}
  except (OSError, zlib.error) as e:
    raise DataError(
        f'Could not read {path}: {e}. Replace it with a fresh copy.'
    ) from e
  names = tuple(str(n) for n in d['writer_names'])
  return _split_source(
      'femnist',
      (_to_float_images(d['x_train'], 255), d['y_train']),
      (_to_float_images(d['x_test'], 255), d['y_test']),
      num_classes=len(FEMNIST_CLASSES),
      groups=np.concatenate([d['writer_train'], d['writer_test']]).astype(
          np.int64
      ),
      group_names=names,
      metadata={'class_names': FEMNIST_CLASSES},
  )


# ----------------------------------------------------------------------------
# Shakespeare (TFF h5).
# ----------------------------------------------------------------------------


def _shakespeare_byte_table() -> np.ndarray:
  table = np.full(256, SHAKESPEARE_OOV_ID, dtype=TOKEN_DTYPE)
  for i, char in enumerate(SHAKESPEARE_CHAR_VOCAB):
    table[ord(char)] = i + 1  # 0 is padding, as in TFF.
  return table


_SHAKESPEARE_BYTE_TO_ID = _shakespeare_byte_table()


def shakespeare_char_ids(snippet: bytes) -> np.ndarray:
  """Maps UTF-8 bytes to TFF's character ids (one id per byte, like TFF).

  TFF splits snippets with `tf.strings.bytes_split`, so a non-ASCII character
  becomes several OOV ids; doing the same keeps ids identical to TFF's.

  Args:
    snippet: Text as UTF-8 bytes.
  """
  return _SHAKESPEARE_BYTE_TO_ID[np.frombuffer(snippet, dtype=np.uint8)]


def shakespeare_windows(
    snippet: bytes, sequence_length: int = SHAKESPEARE_SEQUENCE_LENGTH
) -> tuple[np.ndarray, np.ndarray]:
  """Chops one snippet into (input, target) windows exactly as TFF does.

  Tokens are [BOS] + ids + [EOS], zero-padded to a multiple of
  sequence_length + 1 and cut into windows w; input = w[:-1], target = w[1:].

  Args:
    snippet: Text as UTF-8 bytes.
    sequence_length: Window length (TFF default 80).

  Returns:
    int32 arrays (windows, sequence_length) for inputs and targets.
  """
  ids = np.concatenate(
      [[SHAKESPEARE_BOS_ID], shakespeare_char_ids(snippet),
       [SHAKESPEARE_EOS_ID]]
  ).astype(TOKEN_DTYPE)  # pyformat: disable
  split = sequence_length + 1
  ids = np.pad(ids, (0, (-len(ids)) % split))
  windows = ids.reshape(-1, split)
  return windows[:, :-1], windows[:, 1:]


def _read_shakespeare_h5(path: str) -> dict[str, list[bytes]]:
  import h5py  # pylint: disable=g-import-not-at-top

  try:
    with h5py.File(path, 'r') as f:
      if 'examples' not in f:
        raise DataError(
            f'{path} has no /examples group; expected TFF\'s layout'
            ' /examples/<client>/snippets. Replace it with the original file.'
        )
      examples = f['examples']
      return {
          client: [bytes(s) for s in examples[client]['snippets'][()]]
          for client in examples.keys()
      }
  except (OSError, KeyError) as e:
    raise DataError(
        f'Could not read {path}: {e}. The file is corrupt or not in TFF\'s'
        ' Shakespeare layout; replace it with a fresh copy.'
    ) from e


def load_shakespeare(
    data_dir: str | None = None,
    *,
    sequence_length: int = SHAKESPEARE_SEQUENCE_LENGTH,
) -> Source:
  """Loads TFF's federated Shakespeare; groups are speaking roles (715).

  x and y are int32 (N, sequence_length) windows of TFF character ids, y
  shifted by one; num_classes is the vocabulary size 90.

  Args:
    data_dir: Root data directory (else `$TFF_FAIR_DATA_DIR`).
    sequence_length: Window length.
  """
  if sequence_length < 1:
    raise DataError(
        f'sequence_length must be positive, got {sequence_length}.'
    )
  directory = _dataset_dir(data_dir, 'shakespeare')
  hint = 'Copy shakespeare_train.h5 and shakespeare_test.h5 there.'
  per_split = {
      split: _read_shakespeare_h5(
          _require_file(
              directory, f'shakespeare_{split}.h5', 'Shakespeare', hint
          )
      )
      for split in ('train', 'test')
  }
  names = tuple(sorted(set(per_split['train']) | set(per_split['test'])))
  index = {name: i for i, name in enumerate(names)}
  xs, ys, groups, is_test = [], [], [], []
  for split in ('train', 'test'):
    for client, snippets in sorted(per_split[split].items()):
      for snippet in snippets:
        x, y = shakespeare_windows(snippet, sequence_length)
        xs.append(x)
        ys.append(y)
        groups.append(np.full(len(x), index[client], np.int64))
        is_test.append(np.full(len(x), split == 'test'))
  return Source(
      name='shakespeare',
      x=np.concatenate(xs),
      y=np.concatenate(ys).astype(LABEL_DTYPE),
      num_classes=SHAKESPEARE_VOCAB_SIZE,
      is_test=np.concatenate(is_test),
      groups=np.concatenate(groups),
      group_names=names,
      metadata={
          'vocabulary': SHAKESPEARE_CHAR_VOCAB,
          'pad_id': SHAKESPEARE_PAD_ID,
          'oov_id': SHAKESPEARE_OOV_ID,
          'bos_id': SHAKESPEARE_BOS_ID,
          'eos_id': SHAKESPEARE_EOS_ID,
          'sequence_length': sequence_length,
      },
  )


# ----------------------------------------------------------------------------
# SST-2 (sentence-level stsa files).
# ----------------------------------------------------------------------------


def read_stsa(path: str) -> tuple[list[int], list[list[str]]]:
  """Reads a `stsa.binary.*` file: '<label> <tokenized sentence>' per line.

  Args:
    path: File path.

  Returns:
    (labels, token lists).

  Raises:
    DataError: on a missing file or a malformed line (with its number).
  """
  labels, sentences = [], []
  try:
    with open(path, encoding='utf-8') as f:
      lines = f.read().splitlines()
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f'Could not read {path}: {e}.') from e
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    label, _, text = line.partition(' ')
    if label not in ('0', '1') or not text.strip():
      raise DataError(
          f'{path}:{number}: expected "<0|1> <sentence>", got {line[:40]!r}.'
          ' Replace the file with the original stsa.binary file.'
      )
    labels.append(int(label))
    sentences.append(text.split())
  return labels, sentences


def build_vocabulary(
    sentences: Sequence[Sequence[str]], min_count: int = 1
) -> tuple[str, ...]:
  """Words with at least `min_count` occurrences, most frequent first.

  Ties are broken alphabetically so the vocabulary is reproducible.

  Args:
    sentences: Token lists.
    min_count: Minimum number of occurrences.
  """
  counts = collections.Counter(t for s in sentences for t in s)
  words = [w for w, c in counts.items() if c >= min_count]
  return tuple(sorted(words, key=lambda w: (-counts[w], w)))


def encode_sentences(
    sentences: Sequence[Sequence[str]],
    vocabulary: Sequence[str],
    max_len: int,
) -> np.ndarray:
  """Maps tokens to ids (0 pad, 1 OOV, words from 2), pads/truncates at end.

  Args:
    sentences: Token lists.
    vocabulary: Words; word i gets id i + 2.
    max_len: Output length; longer sentences keep their first tokens.

  Returns:
    int32 array (len(sentences), max_len).
  """
  index = {w: i + 2 for i, w in enumerate(vocabulary)}
  ids = np.full((len(sentences), max_len), SST2_PAD_ID, TOKEN_DTYPE)
  for row, tokens in enumerate(sentences):
    encoded = [index.get(t, SST2_OOV_ID) for t in tokens[:max_len]]
    ids[row, : len(encoded)] = encoded
  return ids


def load_sst2(
    data_dir: str | None = None, *, max_len: int = SST2_MAX_LEN
) -> Source:
  """Loads sentence-level SST-2 from `stsa.binary.{train,dev,test}`.

  The stsa files are used rather than GLUE's: they are sentence-level (GLUE's
  train set mixes in ~60k phrases) and all three splits share one
  tokenization. Train (6,920) and dev (872) are both marked as non-test, in
  that order, because the partitioner carves its own validation data out of
  each client; test (1,821) has is_test=True. The vocabulary comes from the
  train file only, so dev/test words unseen in training map to OOV exactly
  as they would at deployment. metadata['num_tokens'] is the embedding size
  (vocabulary + pad + OOV).

  Args:
    data_dir: Root data directory (else `$TFF_FAIR_DATA_DIR`).
    max_len: Token ids per sentence.
  """
  if max_len < 1:
    raise DataError(f'max_len must be positive, got {max_len}.')
  directory = _dataset_dir(data_dir, 'sst2')
  hint = 'Copy the stsa.binary.{train,dev,test} files there.'
  parts = {
      split: read_stsa(
          _require_file(directory, f'stsa.binary.{split}', 'SST-2', hint)
      )
      for split in ('train', 'dev', 'test')
  }
  vocabulary = build_vocabulary(parts['train'][1])
  encoded = {
      s: encode_sentences(parts[s][1], vocabulary, max_len) for s in parts
  }
  labels = {s: np.array(parts[s][0], LABEL_DTYPE) for s in parts}
  return _split_source(
      'sst2',
      (
          np.concatenate([encoded['train'], encoded['dev']]),
          np.concatenate([labels['train'], labels['dev']]),
      ),
      (encoded['test'], labels['test']),
      num_classes=2,
      metadata={
          'class_names': SST2_CLASSES,
          'num_tokens': len(vocabulary) + 2,
          'vocabulary': vocabulary,
          'pad_id': SST2_PAD_ID,
          'oov_id': SST2_OOV_ID,
          'max_len': max_len,
      },
  )


# ----------------------------------------------------------------------------
# scikit-learn digits.
# ----------------------------------------------------------------------------


def load_digits() -> Source:
  """Loads scikit-learn's bundled 8x8 digits (1,797 images, offline).

  There is no official split: every example has is_test=False and the
  partitioner makes the splits.
  """
  from sklearn import datasets  # pylint: disable=g-import-not-at-top

  digits = datasets.load_digits()
  images = digits.images.astype(np.float32) / np.float32(16.0)
  return Source(
      name='digits',
      x=images[..., np.newaxis],
      y=digits.target.astype(LABEL_DTYPE),
      num_classes=10,
      is_test=np.zeros(len(images), bool),
      metadata={'class_names': DIGIT_CLASSES},
  )


# ----------------------------------------------------------------------------
# TensorFlow Datasets fallback.
# ----------------------------------------------------------------------------

_TFDS_IMAGE_SHAPES = {
    'fashion_mnist': (28, 28, 1),
    'mnist': (28, 28, 1),
    'cifar10': (32, 32, 3),
}
_TFDS_CLASS_NAMES = {
    'fashion_mnist': FASHION_MNIST_CLASSES,
    'mnist': DIGIT_CLASSES,
    'cifar10': CIFAR10_CLASSES,
}


def source_from_tfds_arrays(
    name: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
) -> Source:
  """Converts TFDS numpy (image uint8 NHWC, label) pairs into a Source.

  Kept separate from the download so it can be tested without a network.

  Args:
    name: One of `TFDS_SOURCE_NAMES`.
    train: (images, labels) of the TFDS train split.
    test: (images, labels) of the TFDS test split.
  """
  if name not in _TFDS_IMAGE_SHAPES:
    raise DataError(
        f'use_tfds supports {TFDS_SOURCE_NAMES}, not {name!r}; load'
        f' {name!r} from files instead (use_tfds=False).'
    )
  expected = _TFDS_IMAGE_SHAPES[name]
  parts = []
  for split, (images, labels) in (('train', train), ('test', test)):
    images, labels = np.asarray(images), np.asarray(labels)
    if images.dtype != np.uint8 or images.shape[1:] != expected:
      raise DataError(
          f'TFDS {name} {split} images are {images.dtype}{images.shape}, '
          f'expected uint8 (N,)+{expected}; the TFDS version is incompatible.'
      )
    if labels.shape != (len(images),):
      raise DataError(
          f'TFDS {name} {split}: {len(images)} images but labels of shape'
          f' {labels.shape}; expected one label per image.'
      )
    parts.append((_to_float_images(images, 255), labels))
  return _split_source(
      name,
      parts[0],
      parts[1],
      num_classes=len(_TFDS_CLASS_NAMES[name]),
      metadata={'class_names': _TFDS_CLASS_NAMES[name]},
  )


def _load_with_tfds(name: str, data_dir: str | None) -> Source:
  """Loads a TFDS data set, downloading it unless `data_dir` has it prepared.

  Needs internet only for the download: a data set TFDS has already prepared
  in `data_dir` (downloaded before, or built from local files with
  `download_and_prepare`) is read offline.
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


# ----------------------------------------------------------------------------
# Entry point.
# ----------------------------------------------------------------------------

_FILE_LOADERS: Mapping[str, Callable[[str | None], Source]] = {
    'fashion_mnist': load_fashion_mnist,
    'mnist': load_mnist,
    'femnist': load_femnist,
    'shakespeare': load_shakespeare,
    'sst2': load_sst2,
    'digits': lambda data_dir: load_digits(),
}


def load_source(
    name: str,
    data_dir: str | None = None,
    *,
    max_examples: int | None = None,
    use_tfds: bool = False,
    cache_dir: str | None = None,
) -> Source:
  """Loads a data set by name with default options.

  Use the `load_<name>` functions for non-default options (Shakespeare
  sequence length, SST-2 max_len).

  Args:
    name: One of `SOURCE_NAMES`.
    data_dir: Root data directory; see the module docstring. With use_tfds it
      is TFDS's data_dir.
    max_examples: Keep a deterministic stratified subset of this size.
    use_tfds: Load fashion_mnist/mnist/cifar10 with `tfds.load` instead of
      from files (downloads unless already prepared in `data_dir`).
    cache_dir: CIFAR-10 decode cache directory.

  Returns:
    The pooled Source.

  Raises:
    DataError: unknown name, missing or corrupt files, bad options.
  """
  if name not in SOURCE_NAMES:
    raise DataError(
        f'Unknown data set {name!r}. Valid names: {", ".join(SOURCE_NAMES)}.'
    )
  _check_max_examples(max_examples)
  if use_tfds:
    if name not in TFDS_SOURCE_NAMES:
      raise DataError(
          f'use_tfds supports {", ".join(TFDS_SOURCE_NAMES)}, not {name!r};'
          ' load it from files with use_tfds=False.'
      )
    return subsample(_load_with_tfds(name, data_dir), max_examples)
  if name == 'cifar10':
    # Subsetting before decoding is the whole point for CIFAR-10.
    return load_cifar10(
        data_dir, max_examples=max_examples, cache_dir=cache_dir
    )
  return subsample(_FILE_LOADERS[name](data_dir), max_examples)
