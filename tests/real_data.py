"""Where tests find the data files the repository cannot ship.

A test of a real file (counts, checksums, a parse of the whole file) asks
for it here. When the file is absent the test is skipped with a reason that
names the file and the variable to set, so a fresh clone with nothing beside
it still passes. Every parsing path is also tested on small files the tests
write themselves, so nothing is left untested there.

Set `TFF_FAIR_REQUIRE_DATA=1` (the test command does when the data folder is
present, as in CI) to turn a missing file into a failure instead: a data
folder that is there but incomplete must not pass as skips.

Plain Python on purpose: data tests import it without TensorFlow.
"""

import os
import unittest

# The same names as tff_fair.data.sources; repeated so this module stays
# import-light (sources pulls in numpy-heavy loaders).
DATA_DIR_ENV = 'TFF_FAIR_DATA_DIR'
FASHION_MNIST_DIR_ENV = 'TFF_FAIR_FASHION_MNIST_DIR'
REQUIRE_ENV = 'TFF_FAIR_REQUIRE_DATA'
SYSTEM_FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'

FASHION_MNIST_FILES = (
    'train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
    't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz',
)


def _missing(reason: str) -> None:
  if os.environ.get(REQUIRE_ENV, '') not in ('', '0'):
    raise AssertionError(f'{reason} ({REQUIRE_ENV} is set, so this fails'
                         ' instead of skipping)')
  raise unittest.SkipTest(reason)


def data_dir_with(*relative_paths: str) -> str:
  """The data folder, if it holds every one of `relative_paths`.

  Args:
    *relative_paths: Files under the data folder, e.g.
      'mnist/t10k-images-idx3-ubyte.gz'.

  Returns:
    The value of $TFF_FAIR_DATA_DIR.

  Raises:
    unittest.SkipTest: a file is missing (AssertionError under
      TFF_FAIR_REQUIRE_DATA).
  """
  root = os.environ.get(DATA_DIR_ENV, '')
  if not root:
    _missing(f'needs {", ".join(relative_paths)}: set {DATA_DIR_ENV} to the'
             ' data folder (see README, "Tests and the data they need")')
  absent = [p for p in relative_paths
            if not os.path.isfile(os.path.join(root, p))]
  if absent:
    _missing(f'needs {", ".join(absent)} under {DATA_DIR_ENV}={root}')
  return root


def fashion_mnist_dir() -> str:
  """The folder holding the four Fashion-MNIST idx files; else skips.

  Looks where tff_fair.data.sources looks without an explicit data_dir:
  $TFF_FAIR_FASHION_MNIST_DIR, $TFF_FAIR_DATA_DIR/fashion-mnist, then the
  Debian package's folder.
  """
  candidates = [os.environ.get(FASHION_MNIST_DIR_ENV, '')]
  if os.environ.get(DATA_DIR_ENV):
    candidates.append(os.path.join(os.environ[DATA_DIR_ENV], 'fashion-mnist'))
  candidates.append(SYSTEM_FASHION_MNIST_DIR)
  for directory in filter(None, candidates):
    if all(os.path.isfile(os.path.join(directory, f))
           for f in FASHION_MNIST_FILES):
      return directory
  _missing('needs the Fashion-MNIST idx files: apt-get install'
           f' dataset-fashion-mnist, or set {FASHION_MNIST_DIR_ENV}')
  raise AssertionError('unreachable')
