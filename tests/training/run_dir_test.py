"""The output directory's states, and damaged checkpoints (no TF needed)."""

import os
import re

from absl.testing import absltest

from tff_fair.training import config as config_lib
from tff_fair.training.recipes import registry
from tff_fair.training import run_dir


def _config(out, **overrides):
  return registry.make_config(output_dir=out, rounds=5, **overrides)


def _checkpoints(out, *rounds):
  for r in rounds:
    os.makedirs(run_dir.checkpoint_path(out, r))


class InspectTest(absltest.TestCase):

  def test_new_directory_is_not_created(self):
    out = os.path.join(self.create_tempdir().full_path, 'a', 'b')
    self.assertEqual(run_dir.inspect(_config(out)).kind, 'new')
    self.assertFalse(os.path.exists(out))

  def test_resume_lists_the_checkpoints(self):
    out = self.create_tempdir().full_path
    config_lib.save_if_new(_config(out))
    _checkpoints(out, 0, 3, 2)
    os.makedirs(os.path.join(out, 'checkpoints', 'program_state_4_temp1234'))
    plan = run_dir.inspect(_config(out))
    self.assertEqual((plan.kind, plan.checkpoints), ('resume', (0, 2, 3)))

  def test_finished_run_may_be_extended(self):
    out = self.create_tempdir().full_path
    config_lib.save_if_new(_config(out))
    _checkpoints(out, 0, 5)
    self.assertEqual(run_dir.inspect(_config(out)).kind, 'resume')
    with self.assertRaisesRegex(run_dir.RunDirError, 'past rounds=4'):
      run_dir.inspect(registry.make_config(output_dir=out, rounds=4))

  def test_apply_removes_interrupted_checkpoint_writes_only(self):
    out = self.create_tempdir().full_path
    config_lib.save_if_new(_config(out))
    _checkpoints(out, 0)
    leftover = os.path.join(out, 'checkpoints', 'program_state_1_temp4321')
    os.makedirs(leftover)
    run_dir.inspect(_config(out)).apply()
    self.assertEqual(os.listdir(os.path.join(out, 'checkpoints')),
                     ['program_state_0'])

  def test_unstarted_run_keeps_nothing_of_its_settings(self):
    out = self.create_tempdir().full_path
    config_lib.save_if_new(_config(out, seed=9))
    plan = run_dir.inspect(_config(out, seed=1))
    self.assertEqual(plan.kind, 'unstarted')
    plan.apply()
    self.assertEqual(config_lib.load_saved(out)['seed'], 1)


class LoadCheckpointTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.out = self.create_tempdir().full_path
    _checkpoints(self.out, 0, 2, 3)

  def _load(self, damaged):
    def load(version):
      if version in damaged:
        raise IndexError('Read less bytes than requested')
      return f'state {version}'
    return load

  def test_no_checkpoint(self):
    self.assertEqual(run_dir.load_checkpoint(self.out, [], self._load(())),
                     (None, 0))

  def test_latest_intact(self):
    self.assertEqual(
        run_dir.load_checkpoint(self.out, [0, 2, 3], self._load(())),
        ('state 3', 3))

  def test_damaged_latest_is_named_and_nothing_changes(self):
    path = run_dir.checkpoint_path(self.out, 3)
    with self.assertRaisesRegex(
        run_dir.RunDirError,
        f'latest checkpoint {re.escape(path)} .round 3. is damaged .IndexError: Read'
        ' less bytes.*--checkpoint_fallback'):
      run_dir.load_checkpoint(self.out, [0, 2, 3], self._load({3}))
    self.assertEqual(run_dir.checkpoint_versions(self.out), [0, 2, 3])

  def test_fallback_to_newest_intact(self):
    state = run_dir.load_checkpoint(self.out, [0, 2, 3], self._load({3}),
                                    fallback=True)
    self.assertEqual(state, ('state 2', 2))
    self.assertEqual(run_dir.checkpoint_versions(self.out), [0, 2])
    self.assertTrue(os.path.isdir(
        run_dir.checkpoint_path(self.out, 3) + '_damaged'))

  def test_fallback_refuses_a_round_whose_personal_models_are_gone(self):
    # Falling back past round 2 would train to round 2 again, whose
    # checkpoint tff.program does not overwrite: refused, nothing renamed.
    with self.assertRaisesRegex(
        run_dir.RunDirError,
        'can be resumed: damaged: .*program_state_3 .IndexError.*; not'
        ' usable: round 2 .its personal models were not kept.*--start_over'):
      run_dir.load_checkpoint(
          self.out, [0, 2, 3], self._load({3}), fallback=True,
          usable=lambda v: v and 'its personal models were not kept')
    self.assertEqual(run_dir.checkpoint_versions(self.out), [0, 2, 3])
    self.assertEqual(
        run_dir.load_checkpoint(self.out, [0, 2, 3], self._load({3}),
                                fallback=True, usable=lambda v: None),
        ('state 2', 2))

  def test_nothing_intact(self):
    with self.assertRaisesRegex(run_dir.RunDirError,
                                'No checkpoint .* can be resumed'):
      run_dir.load_checkpoint(self.out, [0, 2, 3], self._load({0, 2, 3}),
                              fallback=True)


if __name__ == '__main__':
  absltest.main()
