"""Fashion-MNIST (60,000 train + 10,000 test) from its idx files.

Fashion-MNIST is usually installed system-wide, so its directory is the
first of these that exists: `<data_dir>/fashion-mnist` when `data_dir` is
passed explicitly (an explicit argument beats the environment), the
environment variable `TFF_FAIR_FASHION_MNIST_DIR`,
`$TFF_FAIR_DATA_DIR/fashion-mnist`, and `/usr/share/datasets/fashion-mnist`
(Debian package `dataset-fashion-mnist`).
"""

from __future__ import annotations

import os

from tff_fair.data.sources import idx
from tff_fair.data.sources import paths
from tff_fair.data.sources import source as source_lib

FASHION_MNIST_DIR_ENV = 'TFF_FAIR_FASHION_MNIST_DIR'
SYSTEM_FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'

FASHION_MNIST_CLASSES = (
    'T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat',
    'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot',
)  # pyformat: disable


def fashion_mnist_dir_candidates(data_dir: str | None) -> list[str]:
  """Returns the Fashion-MNIST directories to try, most specific first."""
  candidates = []
  if data_dir:
    candidates.append(os.path.join(data_dir, 'fashion-mnist'))
  if os.environ.get(FASHION_MNIST_DIR_ENV):
    candidates.append(os.environ[FASHION_MNIST_DIR_ENV])
  if os.environ.get(paths.DATA_DIR_ENV):
    candidates.append(
        os.path.join(os.environ[paths.DATA_DIR_ENV], 'fashion-mnist'))
  candidates.append(SYSTEM_FASHION_MNIST_DIR)
  return [os.path.expanduser(c) for c in candidates]


def load_fashion_mnist(data_dir: str | None = None) -> source_lib.Source:
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
  for split, (images, labels) in idx.IDX_FILE_NAMES.items():
    parts[split] = idx.read_image_label_pair(
        paths.require_file(directory, images, 'Fashion-MNIST', hint),
        paths.require_file(directory, labels, 'Fashion-MNIST', hint),
    )
  return source_lib.from_train_test(
      'fashion_mnist',
      parts['train'],
      parts['test'],
      num_classes=10,
      metadata={'class_names': FASHION_MNIST_CLASSES, 'directory': directory},
  )
