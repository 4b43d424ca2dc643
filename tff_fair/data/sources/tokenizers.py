"""Text to token ids: Shakespeare's characters (as TFF) and SST-2's words.

Token ids are int32 (`source.TOKEN_DTYPE`) with 0 as padding.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from tff_fair.data.sources import source as source_lib

# TFF's Shakespeare character vocabulary, copied from
# tensorflow_federated/python/simulation/baselines/shakespeare/
# char_prediction_preprocessing.py (CHAR_VOCAB) so that token ids match TFF's
# baseline task; shakespeare_test checks the copy against the installed TFF.
# Copied rather than imported to keep the loaders free of a TFF import and of
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

SST2_PAD_ID = 0
SST2_OOV_ID = 1


def _shakespeare_byte_table() -> np.ndarray:
  table = np.full(256, SHAKESPEARE_OOV_ID, dtype=source_lib.TOKEN_DTYPE)
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
  ).astype(source_lib.TOKEN_DTYPE)  # pyformat: disable
  split = sequence_length + 1
  ids = np.pad(ids, (0, (-len(ids)) % split))
  windows = ids.reshape(-1, split)
  return windows[:, :-1], windows[:, 1:]


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
  ids = np.full((len(sentences), max_len), SST2_PAD_ID, source_lib.TOKEN_DTYPE)
  for row, tokens in enumerate(sentences):
    encoded = [index.get(t, SST2_OOV_ID) for t in tokens[:max_len]]
    ids[row, : len(encoded)] = encoded
  return ids
