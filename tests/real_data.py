"""Where tests find the data files the repository cannot ship.

A test of a real file (counts, checksums, a parse of the whole file) asks
for it here. When the file is absent the test is skipped with a reason that
names the file and the variable to set, so a fresh clone with nothing beside
it still passes. Every parsing path is also tested on small files the tests
write themselves, so nothing is left untested there.

Set `TFF_FAIR_REQUIRE_DATA=1` (the test command does when the data folder is
present, as in CI) to turn a missing file into a failure instead: a data
folder that is there but incomplete must not pass as skips.

It asks the loaders' own modules where files are looked for (numpy only:
data tests import it without TensorFlow).
"""

import os
import unittest

from tff_fair.data.sources import fashion_mnist
from tff_fair.data.sources import idx
from tff_fair.data.sources import paths

REQUIRE_ENV = 'TFF_FAIR_REQUIRE_DATA'


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
  root = os.environ.get(paths.DATA_DIR_ENV, '')
  if not root:
    _missing(f'needs {", ".join(relative_paths)}: set {paths.DATA_DIR_ENV}'
             ' to the data folder (see docs/data.md, "Tests and the data they'
             ' need")')
  absent = [p for p in relative_paths
            if not os.path.isfile(os.path.join(root, p))]
  if absent:
    _missing(f'needs {", ".join(absent)} under {paths.DATA_DIR_ENV}={root}')
  return root


def fashion_mnist_dir() -> str:
  """The folder the Fashion-MNIST loader reads, if it holds the four files.

  The loader's own search (`fashion_mnist.fashion_mnist_dir_candidates`)
  without an explicit data_dir; else skips.
  """
  candidates = fashion_mnist.fashion_mnist_dir_candidates(None)
  directory = next((c for c in candidates if os.path.isdir(c)), '')
  names = [name for pair in idx.IDX_FILE_NAMES.values() for name in pair]
  if directory and all(os.path.isfile(os.path.join(directory, name))
                       for name in names):
    return directory
  _missing('needs the Fashion-MNIST idx files: apt-get install'
           ' dataset-fashion-mnist, or set'
           f' {fashion_mnist.FASHION_MNIST_DIR_ENV}')
  raise AssertionError('unreachable')
