"""The per-client state store: versions, consistency, damage detection."""

import os

from absl.testing import absltest
import numpy as np

from tff_fair.state import client_store

_TEMPLATE = [np.zeros((3, 2), np.float32), np.zeros((4,), np.float32)]


def _arrays(value):
  return [np.full((3, 2), value, np.float32), np.full((4,), value, np.float32)]


class ClientStateStoreTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.store = client_store.ClientStateStore(self.root, _TEMPLATE)

  def _round(self, version, values, store=None):
    store = store or self.store
    for cid, value in values.items():
      store.write(cid, _arrays(value), version, metadata={'lam': value})
    store.commit(version)

  def test_new_client_reads_none_and_written_state_round_trips(self):
    self.store.open(0)
    self.assertIsNone(self.store.read('a'))
    self._round(1, {'a': 1.0, 'b/odd id': 2.0})
    reopened = client_store.ClientStateStore(self.root, _TEMPLATE)
    reopened.open(1)
    self.assertEqual(reopened.client_ids(), ['a', 'b/odd id'])
    np.testing.assert_array_equal(reopened.read('b/odd id')[0],
                                  _arrays(2.0)[0])
    self.assertEqual(reopened.metadata('a'), {'lam': 1.0})
    self.assertIsNone(reopened.metadata('c'))

  def test_unwritten_clients_keep_their_state_across_rounds(self):
    self.store.open(0)
    self._round(1, {'a': 1.0, 'b': 2.0})
    self._round(2, {'a': 3.0})
    self.store.prune(2, updated=['a'])
    np.testing.assert_array_equal(self.store.read('b')[1], _arrays(2.0)[1])
    np.testing.assert_array_equal(self.store.read('a')[1], _arrays(3.0)[1])

  def test_resume_uses_the_checkpoint_version_not_later_writes(self):
    self.store.open(0)
    self._round(1, {'a': 1.0})
    # Round 2 committed, but its server checkpoint never made it to disk.
    self._round(2, {'a': 9.0, 'b': 9.0})
    resumed = client_store.ClientStateStore(self.root, _TEMPLATE)
    resumed.open(1)
    np.testing.assert_array_equal(resumed.read('a')[0], _arrays(1.0)[0])
    self.assertIsNone(resumed.read('b'))
    # Round 2 runs again and overwrites the stale files.
    self._round(2, {'a': 5.0}, store=resumed)
    resumed.prune(2, updated=['a'])
    again = client_store.ClientStateStore(self.root, _TEMPLATE)
    again.open(2)
    np.testing.assert_array_equal(again.read('a')[0], _arrays(5.0)[0])
    self.assertIsNone(again.read('b'))

  def test_prune_keeps_only_what_the_manifest_needs(self):
    self.store.open(0)
    self._round(1, {'a': 1.0, 'b': 1.0})
    self._round(2, {'a': 2.0})
    self.assertEqual(client_store.committed_versions(self.root), [1, 2])
    self.store.prune(2, updated=['a'])
    manifests = os.listdir(os.path.join(self.root, 'manifests'))
    self.assertEqual(manifests, ['v2.json'])
    self.assertEqual(client_store.committed_versions(self.root), [2])
    self.assertEqual(client_store.committed_versions(
        os.path.join(self.root, 'absent')), [])
    files = sorted(
        name for _, _, names in os.walk(os.path.join(self.root, 'clients'))
        for name in names)
    self.assertEqual(files, ['v1.npz', 'v2.npz'])  # b's v1, a's v2.

  def _files(self):
    return sorted(
        os.path.relpath(os.path.join(path, name), self.root)
        for path, _, names in os.walk(os.path.join(self.root, 'clients'))
        for name in names)

  def test_prune_keeps_the_versions_of_kept_checkpoints(self):
    # As the driver: keep=the rounds whose checkpoints are kept (0 and the
    # last two); each of those can still be opened after pruning.
    self.store.open(0)
    values = {1: {'a': 1.0, 'b': 1.0}, 2: {'a': 2.0}, 3: {'b': 3.0},
              4: {'c': 4.0}}
    for version, written in values.items():
      self._round(version, written)
      self.store.prune(version, updated=list(written),
                       keep=[0, version - 1, version])
    self.assertEqual(client_store.committed_versions(self.root), [3, 4])
    key = client_store._client_key
    # a's v2 (current in 3 and 4), b's v3, c's v4; b's v1 and a's v1 gone.
    self.assertEqual(self._files(), [
        os.path.join('clients', key('a'), 'v2.npz'),
        os.path.join('clients', key('b'), 'v3.npz'),
        os.path.join('clients', key('c'), 'v4.npz')])
    older = client_store.ClientStateStore(self.root, _TEMPLATE)
    older.open(3)
    np.testing.assert_array_equal(older.read('b')[0], _arrays(3.0)[0])
    self.assertIsNone(older.read('c'))
    # Round 5 drops manifest 3 and b's v3 with it only if 4 no longer
    # needs it: b is current at v3 in 4, so its file stays.
    self._round(5, {'a': 5.0})
    self.store.prune(5, updated=['a'], keep=[0, 4, 5])
    self.assertEqual(client_store.committed_versions(self.root), [4, 5])
    self.assertEqual(self._files(), [
        os.path.join('clients', key('a'), 'v2.npz'),
        os.path.join('clients', key('a'), 'v5.npz'),
        os.path.join('clients', key('b'), 'v3.npz'),
        os.path.join('clients', key('c'), 'v4.npz')])

  def _only_file_of(self, cid):
    directory = os.path.join(self.root, 'clients',
                             client_store._client_key(cid))
    return os.path.join(directory, os.listdir(directory)[0])

  def test_damaged_state_is_reported_not_replaced(self):
    self.store.open(0)
    self._round(1, {'a': 1.0})
    path = self._only_file_of('a')
    with open(path, 'r+b') as f:
      f.seek(-8, os.SEEK_END)
      f.write(b'XXXXXXXX')
    with self.assertRaisesRegex(client_store.ClientStateError,
                                "client 'a'.*damaged"):
      self.store.read('a')
    with open(path, 'rb') as f:
      self.assertIn(b'XXXXXXXX', f.read())  # Left as found.

  def test_missing_state_is_reported(self):
    self.store.open(0)
    self._round(1, {'a': 1.0})
    os.remove(self._only_file_of('a'))
    with self.assertRaisesRegex(client_store.ClientStateError,
                                "client 'a'.*missing"):
      self.store.read('a')

  def test_missing_manifest_is_reported(self):
    with self.assertRaisesRegex(client_store.ClientStateError,
                                'manifest .* round 3 is missing'):
      self.store.open(3)

  def test_state_of_another_model_is_refused(self):
    self.store.open(0)
    self._round(1, {'a': 1.0})
    other = client_store.ClientStateStore(
        self.root, [np.zeros((5,), np.float32)])
    other.open(1)
    with self.assertRaisesRegex(client_store.ClientStateError,
                                'another model'):
      other.read('a')
    with self.assertRaisesRegex(ValueError, 'shapes'):
      self.store.write('a', [np.zeros((5,), np.float32)], 2)

  def test_versions_only_move_forward(self):
    self.store.open(0)
    self._round(1, {'a': 1.0})
    with self.assertRaisesRegex(ValueError, 'Cannot write round 1'):
      self.store.write('a', _arrays(2.0), 1)


if __name__ == '__main__':
  absltest.main()
