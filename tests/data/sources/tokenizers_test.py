"""Tests for tff_fair.data.sources.tokenizers."""

from absl.testing import absltest
import numpy as np

from tff_fair.data.sources import tokenizers


class TokenizersTest(absltest.TestCase):

  def test_shakespeare_windows(self):
    x, y = tokenizers.shakespeare_windows(b'ab', sequence_length=3)
    a, b = (tokenizers.SHAKESPEARE_CHAR_VOCAB.index(c) + 1 for c in 'ab')
    bos, eos = tokenizers.SHAKESPEARE_BOS_ID, tokenizers.SHAKESPEARE_EOS_ID
    np.testing.assert_array_equal(x, [[bos, a, b]])
    np.testing.assert_array_equal(y, [[a, b, eos]])
    x, _ = tokenizers.shakespeare_windows('é'.encode(), sequence_length=80)
    oov = tokenizers.SHAKESPEARE_OOV_ID
    np.testing.assert_array_equal(x[0, :4], [bos, oov, oov, eos])

  def test_vocabulary_and_encoding(self):
    sentences = [['b', 'a', 'b'], ['c', 'a', 'b']]
    vocabulary = tokenizers.build_vocabulary(sentences)
    self.assertEqual(vocabulary, ('b', 'a', 'c'))
    ids = tokenizers.encode_sentences([['a', 'zzz', 'b', 'c']], vocabulary, 3)
    np.testing.assert_array_equal(ids, [[3, tokenizers.SST2_OOV_ID, 2]])
    ids = tokenizers.encode_sentences([['c']], vocabulary, 3)
    np.testing.assert_array_equal(ids, [[4, 0, 0]])


if __name__ == '__main__':
  absltest.main()
