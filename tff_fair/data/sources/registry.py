"""`load_source(name, ...)`: every data set by name, with default options.

Use the `load_<name>` function of a data set's own module for non-default
options (`shakespeare.load_shakespeare(sequence_length=...)`,
`sst2.load_sst2(max_len=...)`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tff_fair.data.sources import cifar10
from tff_fair.data.sources import digits
from tff_fair.data.sources import fashion_mnist
from tff_fair.data.sources import femnist
from tff_fair.data.sources import mnist
from tff_fair.data.sources import shakespeare
from tff_fair.data.sources import source as source_lib
from tff_fair.data.sources import sst2
from tff_fair.data.sources import tfds_loader

SOURCE_NAMES = (
    'fashion_mnist',
    'mnist',
    'cifar10',
    'femnist',
    'shakespeare',
    'sst2',
    'digits',
)

# The loaders that read everything, then subsample (CIFAR-10 subsamples
# before decoding, see `load_source`).
_FILE_LOADERS: Mapping[str, Callable[[str | None], source_lib.Source]] = {
    'fashion_mnist': fashion_mnist.load_fashion_mnist,
    'mnist': mnist.load_mnist,
    'femnist': femnist.load_femnist,
    'shakespeare': shakespeare.load_shakespeare,
    'sst2': sst2.load_sst2,
    'digits': lambda data_dir: digits.load_digits(),
}


def load_source(
    name: str,
    data_dir: str | None = None,
    *,
    max_examples: int | None = None,
    use_tfds: bool = False,
    cache_dir: str | None = None,
) -> source_lib.Source:
  """Loads a data set by name with default options.

  Args:
    name: One of `SOURCE_NAMES`.
    data_dir: Root data directory; see `tff_fair.data.sources.paths`. With
      use_tfds it is TFDS's data_dir.
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
    raise source_lib.DataError(
        f'Unknown data set {name!r}. Valid names: {", ".join(SOURCE_NAMES)}.'
    )
  source_lib.check_max_examples(max_examples)
  if use_tfds:
    if name not in tfds_loader.TFDS_SOURCE_NAMES:
      raise source_lib.DataError(
          f'use_tfds supports {", ".join(tfds_loader.TFDS_SOURCE_NAMES)}, not'
          f' {name!r}; load it from files with use_tfds=False.'
      )
    return source_lib.subsample(tfds_loader.load_with_tfds(name, data_dir),
                                max_examples)
  if name == 'cifar10':
    # Subsetting before decoding is the whole point for CIFAR-10.
    return cifar10.load_cifar10(
        data_dir, max_examples=max_examples, cache_dir=cache_dir
    )
  return source_lib.subsample(_FILE_LOADERS[name](data_dir), max_examples)
