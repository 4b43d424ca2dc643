"""TFF's federated Shakespeare (h5 files), grouped by speaking role."""

from __future__ import annotations

import numpy as np

from tff_fair.data.sources import paths
from tff_fair.data.sources import source as source_lib
from tff_fair.data.sources import tokenizers


def _read_h5(path: str) -> dict[str, list[bytes]]:
  """Reads TFF's layout /examples/<client>/snippets: client -> snippets."""
  import h5py  # pylint: disable=g-import-not-at-top

  try:
    with h5py.File(path, 'r') as f:
      if 'examples' not in f:
        raise source_lib.DataError(
            f'{path} has no /examples group; expected TFF\'s layout'
            ' /examples/<client>/snippets. Replace it with the original file.'
        )
      examples = f['examples']
      return {
          client: [bytes(s) for s in examples[client]['snippets'][()]]
          for client in examples.keys()
      }
  except (OSError, KeyError) as e:
    raise source_lib.DataError(
        f'Could not read {path}: {e}. The file is corrupt or not in TFF\'s'
        ' Shakespeare layout; replace it with a fresh copy.'
    ) from e


def load_shakespeare(
    data_dir: str | None = None,
    *,
    sequence_length: int = tokenizers.SHAKESPEARE_SEQUENCE_LENGTH,
) -> source_lib.Source:
  """Loads TFF's federated Shakespeare; groups are speaking roles (715).

  x and y are int32 (N, sequence_length) windows of TFF character ids, y
  shifted by one; num_classes is the vocabulary size 90.

  Args:
    data_dir: Root data directory (else `$TFF_FAIR_DATA_DIR`).
    sequence_length: Window length.
  """
  if sequence_length < 1:
    raise source_lib.DataError(
        f'sequence_length must be positive, got {sequence_length}.'
    )
  directory = paths.dataset_dir(data_dir, 'shakespeare')
  hint = 'Copy shakespeare_train.h5 and shakespeare_test.h5 there.'
  per_split = {
      split: _read_h5(
          paths.require_file(
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
        x, y = tokenizers.shakespeare_windows(snippet, sequence_length)
        xs.append(x)
        ys.append(y)
        groups.append(np.full(len(x), index[client], np.int64))
        is_test.append(np.full(len(x), split == 'test'))
  return source_lib.Source(
      name='shakespeare',
      x=np.concatenate(xs),
      y=np.concatenate(ys).astype(source_lib.LABEL_DTYPE),
      num_classes=tokenizers.SHAKESPEARE_VOCAB_SIZE,
      is_test=np.concatenate(is_test),
      groups=np.concatenate(groups),
      group_names=names,
      metadata={
          'vocabulary': tokenizers.SHAKESPEARE_CHAR_VOCAB,
          'pad_id': tokenizers.SHAKESPEARE_PAD_ID,
          'oov_id': tokenizers.SHAKESPEARE_OOV_ID,
          'bos_id': tokenizers.SHAKESPEARE_BOS_ID,
          'eos_id': tokenizers.SHAKESPEARE_EOS_ID,
          'sequence_length': sequence_length,
      },
  )
