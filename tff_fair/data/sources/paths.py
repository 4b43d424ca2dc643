"""Where the loaders look for their files.

The root data directory is the `data_dir` argument if given, else the
environment variable `TFF_FAIR_DATA_DIR`. Inside it each data set has its
own directory with the file names of the shared offline data:

```
<data_dir>/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
<data_dir>/mnist/t10k-{images-idx3,labels-idx1}-ubyte.gz  (+ train-* optional)
<data_dir>/cifar10/cifar10_jpeg.tar
<data_dir>/femnist/femnist_partial.npz
<data_dir>/shakespeare/shakespeare_{train,test}.h5
<data_dir>/sst2/stsa.binary.{train,dev,test}
```

Fashion-MNIST is usually installed system-wide and has more places to be
found (`fashion_mnist.fashion_mnist_dir_candidates`); `digits` needs no
files. Facts about the individual files (counts, orders, encodings) are in
the README that ships with the offline data.
"""

from __future__ import annotations

import os

from tff_fair.data.sources import source as source_lib

DATA_DIR_ENV = 'TFF_FAIR_DATA_DIR'


def resolve_data_dir(data_dir: str | None) -> str:
  """Returns the root data directory: `data_dir`, else `$TFF_FAIR_DATA_DIR`.

  Args:
    data_dir: Explicit directory or None.

  Raises:
    DataError: if neither is set or the directory does not exist.
  """
  root = data_dir if data_dir else os.environ.get(DATA_DIR_ENV)
  if not root:
    raise source_lib.DataError(
        'No data directory given. Pass data_dir=... or set the environment'
        f' variable {DATA_DIR_ENV} to the directory that holds mnist/,'
        ' cifar10/, femnist/, shakespeare/ and sst2/.'
    )
  root = os.path.expanduser(root)
  if os.path.exists(root) and not os.path.isdir(root):
    raise source_lib.DataError(
        f'Data directory {root} is a file, not a directory. Pass data_dir=...'
        f' or set {DATA_DIR_ENV} to the directory holding the data sets.'
    )
  if not os.path.isdir(root):
    raise source_lib.DataError(
        f'Data directory {root} does not exist. Pass data_dir=... or set'
        f' {DATA_DIR_ENV} to an existing directory holding the data sets.'
    )
  return root


def dataset_dir(data_dir: str | None, subdir: str) -> str:
  """Returns `<root data directory>/<subdir>`, which must exist.

  Args:
    data_dir: Explicit root data directory or None.
    subdir: The data set's directory name, e.g. 'mnist'.

  Raises:
    DataError: if the root or the data set's directory is missing.
  """
  path = os.path.join(resolve_data_dir(data_dir), subdir)
  if not os.path.isdir(path):
    raise source_lib.DataError(
        f'Directory {path} not found. Put the {subdir} files there (see the'
        f' module docstring of {__name__} for the layout) or point data_dir'
        f' / {DATA_DIR_ENV} at the directory that contains {subdir}/.'
    )
  return path


def require_file(
    directory: str, filename: str, label: str, hint: str
) -> str:
  """Returns directory/filename or raises an error saying how to fix it.

  Args:
    directory: Where the file should be.
    filename: Its name.
    label: The data set's name in the message, e.g. 'MNIST'.
    hint: How to fix a missing file.

  Raises:
    DataError: if the file is missing.
  """
  path = os.path.join(directory, filename)
  if not os.path.isfile(path):
    raise source_lib.DataError(
        f'{label} file {filename} not found in {directory}. {hint}')
  return path
