"""Tests for tff_fair.data.sources.shakespeare.

`RealFilesTest` reads `TFF_FAIR_DATA_DIR` and is skipped, by name, where
the files are absent (see tests/real_data.py).
"""

import collections
import os

from absl.testing import absltest
import numpy as np

from tests import real_data
from tff_fair.data.sources import registry
from tff_fair.data.sources import source as source_lib
from tff_fair.data.sources import tokenizers

_SHAKESPEARE_FILES = ('shakespeare/shakespeare_train.h5',
                      'shakespeare/shakespeare_test.h5')


class RealFilesTest(absltest.TestCase):
  """Loaders on the real offline files; facts from the data README."""

  def test_shakespeare(self):
    source = registry.load_source(
        'shakespeare', real_data.data_dir_with(*_SHAKESPEARE_FILES))
    self.assertLen(source.group_names, 715)
    self.assertEqual(source.num_classes, 90)
    self.assertEqual(source.x.shape[1:], (80,))
    self.assertEqual(source.y.shape, source.x.shape)
    self.assertEqual(source.x.dtype, np.int32)
    self.assertEqual(source.y.dtype, np.int32)
    np.testing.assert_array_equal(source.x[:, 1:], source.y[:, :-1])
    self.assertBetween(int(source.x.max()), 1, 89)
    windows = np.concatenate([source.x, source.y[:, -1:]], axis=1)
    for is_test, snippets, characters in (
        (False, 16068, 2359315),
        (True, 2356, 339752),
    ):
      part = windows[source.is_test == is_test]
      # One BOS per snippet, at the start of its first window.
      bos = tokenizers.SHAKESPEARE_BOS_ID
      self.assertEqual(int((part == bos).sum()), snippets)
      self.assertEqual(
          int((part[:, 0] == tokenizers.SHAKESPEARE_BOS_ID).sum()), snippets
      )
      # Every character of the README's count becomes one id in 1..87.
      self.assertEqual(int(((part >= 1) & (part <= 87)).sum()), characters)
      self.assertLen(np.unique(source.groups[source.is_test == is_test]), 715)

  def test_shakespeare_matches_tff_preprocessing(self):
    import h5py  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.simulation.baselines import client_spec  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.simulation.baselines.shakespeare import char_prediction_preprocessing as tff_pre  # pylint: disable=g-import-not-at-top

    self.assertEqual(tuple(tff_pre.CHAR_VOCAB),
                     tokenizers.SHAKESPEARE_CHAR_VOCAB)
    self.assertEqual(
        tff_pre.get_special_tokens(),
        (
            tokenizers.SHAKESPEARE_PAD_ID,
            tokenizers.SHAKESPEARE_OOV_ID,
            tokenizers.SHAKESPEARE_BOS_ID,
            tokenizers.SHAKESPEARE_EOS_ID,
        ),
    )
    role = 'ALL_S_WELL_THAT_ENDS_WELL_ADAM'
    data_dir = real_data.data_dir_with(*_SHAKESPEARE_FILES)
    path = os.path.join(data_dir, 'shakespeare', 'shakespeare_train.h5')
    with h5py.File(path, 'r') as f:
      snippets = f['examples'][role]['snippets'][()]
    preprocess = tff_pre.create_preprocess_fn(
        client_spec.ClientSpec(
            num_epochs=1, batch_size=10000, shuffle_buffer_size=1
        )
    )
    tff_x, tff_y = next(
        iter(
            preprocess(
                tf.data.Dataset.from_tensor_slices(
                    collections.OrderedDict(snippets=snippets)
                )
            )
        )
    )
    source = registry.load_source('shakespeare', data_dir)
    mask = (source.groups == source.group_names.index(role)) & ~source.is_test
    np.testing.assert_array_equal(source.x[mask], tff_x.numpy())
    np.testing.assert_array_equal(source.y[mask], tff_y.numpy())


class FakeFilesTest(absltest.TestCase):
  """The loader on small files written here in the real formats."""

  def test_shakespeare_h5(self):
    import h5py  # pylint: disable=g-import-not-at-top

    root = self.create_tempdir()
    root.mkdir('shakespeare')
    text = {
        'train': {'ROLE_A': [b'To be', b'x' * 85], 'ROLE_B': [b'Hi']},
        'test': {'ROLE_A': [b'Or not'], 'ROLE_B': [b'Bye']},
    }
    for split, roles in text.items():
      path = os.path.join(root.full_path, 'shakespeare',
                          f'shakespeare_{split}.h5')
      with h5py.File(path, 'w') as f:
        for role, snippets in roles.items():
          f.create_dataset(f'examples/{role}/snippets',
                           data=np.array(snippets, dtype=object),
                           dtype=h5py.string_dtype('utf-8'))
    source = registry.load_source('shakespeare', root.full_path)
    self.assertEqual(source.group_names, ('ROLE_A', 'ROLE_B'))
    # One window per short snippet; 'x' * 85 + BOS + EOS = 87 ids: two.
    self.assertEqual(source.x.shape, (6, 80))
    np.testing.assert_array_equal(source.is_test, [False] * 4 + [True] * 2)
    np.testing.assert_array_equal(source.groups, [0, 0, 0, 1, 0, 1])
    bos, eos = tokenizers.SHAKESPEARE_BOS_ID, tokenizers.SHAKESPEARE_EOS_ID
    expected = np.concatenate([[bos], tokenizers.shakespeare_char_ids(b'To be'),
                               [eos]])
    np.testing.assert_array_equal(source.x[0, :7], expected)
    np.testing.assert_array_equal(source.y[0, :6], expected[1:])
    self.assertEqual(int(source.x[0, 7:].sum()), 0)  # Padding.
    np.testing.assert_array_equal(source.x[:, 1:], source.y[:, :-1])

  def test_shakespeare_wrong_layout(self):
    import h5py  # pylint: disable=g-import-not-at-top

    root = self.create_tempdir()
    root.mkdir('shakespeare')
    for split in ('train', 'test'):
      path = os.path.join(
          root.full_path, 'shakespeare', f'shakespeare_{split}.h5'
      )
      with h5py.File(path, 'w') as f:
        f.create_dataset('other', data=np.zeros(3))
    with self.assertRaisesRegex(source_lib.DataError, 'has no /examples group'):
      registry.load_source('shakespeare', root.full_path)


if __name__ == '__main__':
  absltest.main()
