"""RoundStateStore: one JSON value per round, resumable like the checkpoints."""

import json
import os

from absl.testing import absltest

from tff_fair.state import client_store
from tff_fair.state import round_state


class RoundStateStoreTest(absltest.TestCase):

  def test_rounds_commit_open_and_prune(self):
    root = self.create_tempdir().full_path
    store = round_state.RoundStateStore(root, initial={'c': [0.5, 0.5]})
    self.assertEqual(store.open(0), {'c': [0.5, 0.5]})
    for round_num in (1, 2, 3, 4):
      store.stage({'c': [round_num, 1.0]})
      store.commit(round_num)
      # The checkpoints kept: round 0 and the last two.
      store.prune(round_num, keep=[0, round_num - 1, round_num])
    self.assertEqual(store.committed_versions(), [3, 4])
    self.assertEqual(client_store.committed_versions(root), [3, 4])
    # A resume from round 3 reads round 3's value, not the latest.
    reopened = round_state.RoundStateStore(root, initial=None)
    self.assertEqual(reopened.open(3), {'c': [3, 1.0]})
    self.assertEqual(reopened.value, {'c': [3, 1.0]})

  def test_a_value_of_a_later_round_is_overwritten_when_it_runs_again(self):
    root = self.create_tempdir().full_path
    store = round_state.RoundStateStore(root)
    store.stage([1])
    store.commit(1)
    store.stage([2])
    store.commit(2)  # Killed before the checkpoint of round 2.
    store.open(1)
    self.assertEqual(store.value, [1])
    store.stage([22])
    store.commit(2)
    self.assertEqual(round_state.RoundStateStore(root).open(2), [22])

  def test_missing_or_damaged_value_names_the_file(self):
    root = self.create_tempdir().full_path
    store = round_state.RoundStateStore(root)
    with self.assertRaisesRegex(client_store.ClientStateError,
                                r'v2\.json of round 2 is missing'):
      store.open(2)
    store.stage({'a': 1})
    store.commit(1)
    with open(os.path.join(root, 'manifests', 'v1.json'), 'w') as f:
      f.write('{"value": ')
    with self.assertRaisesRegex(client_store.ClientStateError,
                                r'v1\.json of round 1 is missing or damaged'):
      store.open(1)

  def test_values_json_cannot_hold_are_refused_when_staged(self):
    store = round_state.RoundStateStore(self.create_tempdir().full_path)
    with self.assertRaises(TypeError):
      store.stage({'a': object()})
    self.assertIsNone(store.value)

  def test_commit_is_atomic_json(self):
    root = self.create_tempdir().full_path
    store = round_state.RoundStateStore(root)
    store.stage({'widths': [0.25, 1.0]})
    store.commit(5)
    with open(os.path.join(root, 'manifests', 'v5.json')) as f:
      self.assertEqual(json.load(f), {'value': {'widths': [0.25, 1.0]}})
    self.assertEqual(os.listdir(os.path.join(root, 'manifests')), ['v5.json'])


if __name__ == '__main__':
  absltest.main()
