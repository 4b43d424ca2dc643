"""Sentence-level SST-2 from the `stsa.binary.{train,dev,test}` files."""

from __future__ import annotations

import numpy as np

from tff_fair.data.sources import paths
from tff_fair.data.sources import source as source_lib
from tff_fair.data.sources import tokenizers

SST2_CLASSES = ('negative', 'positive')
SST2_MAX_LEN = 50


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
    raise source_lib.DataError(f'Could not read {path}: {e}.') from e
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    label, _, text = line.partition(' ')
    if label not in ('0', '1') or not text.strip():
      raise source_lib.DataError(
          f'{path}:{number}: expected "<0|1> <sentence>", got {line[:40]!r}.'
          ' Replace the file with the original stsa.binary file.'
      )
    labels.append(int(label))
    sentences.append(text.split())
  return labels, sentences


def load_sst2(
    data_dir: str | None = None, *, max_len: int = SST2_MAX_LEN
) -> source_lib.Source:
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
    raise source_lib.DataError(f'max_len must be positive, got {max_len}.')
  directory = paths.dataset_dir(data_dir, 'sst2')
  hint = 'Copy the stsa.binary.{train,dev,test} files there.'
  parts = {
      split: read_stsa(
          paths.require_file(directory, f'stsa.binary.{split}', 'SST-2', hint)
      )
      for split in ('train', 'dev', 'test')
  }
  vocabulary = tokenizers.build_vocabulary(parts['train'][1])
  encoded = {
      s: tokenizers.encode_sentences(parts[s][1], vocabulary, max_len)
      for s in parts
  }
  labels = {s: np.array(parts[s][0], source_lib.LABEL_DTYPE) for s in parts}
  return source_lib.from_train_test(
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
          'pad_id': tokenizers.SST2_PAD_ID,
          'oov_id': tokenizers.SST2_OOV_ID,
          'max_len': max_len,
      },
  )
