"""Bad inputs and damaged run directories, through the real train program.

The full table of bad inputs runs in-process (tests/training/
bad_inputs_test.py); this checks that the program turns them into exit
status 2 and one logged message, with no traceback, no training and the
output directory unchanged, and how it treats a damaged or partial run
directory.
"""

import json
import os
import shutil

from absl.testing import absltest
from absl.testing import parameterized

from tests import snapshot as snapshot_lib
from tests import tff_test_utils


def _flags(output_dir, **overrides):
  return tff_test_utils.train_command(
      output_dir, **{'clients_per_round': 4, 'rounds': 2, **overrides})


class BadInputsThroughTheProgramTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('more_clients_than_examples',
       dict(num_clients=2000, clients_per_round=2000), ['at most 1797']),
      ('unknown_model', dict(model='junk'), ['Unknown model', 'junk']),
      ('one_example_per_client', dict(examples_per_client=1),
       ['no test examples']),
      ('huge_seed', dict(seed=2**64), ['seed must be in']),
      ('missing_contributions_file',
       dict(algorithm='aequa', contributions_file='/nonexistent/c.json'),
       ['Cannot read /nonexistent/c.json']),
      ('lambdas_file_with_aequa',
       dict(algorithm='aequa', ditto_lambdas_file='/nonexistent/l.json'),
       ['--ditto_lambdas_file=/nonexistent/l.json',
        'setting of --algorithm=ditto', '--algorithm=aequa ignores']),
      ('bad_flag_value', dict(algorithm='fedfoo'),
       ['Flags parsing error', 'fedfoo']),
  )
  def test_exit_2_with_one_message(self, overrides, keywords):
    out = os.path.join(self.create_tempdir().full_path, 'run')
    result = tff_test_utils.run_module(_flags(out, **overrides))
    tff_test_utils.assert_refused(self, result, keywords, out)

  def test_output_dir_that_is_a_file(self):
    path = self.create_tempfile(content='mine').full_path
    result = tff_test_utils.run_module(_flags(path))
    self.assertEqual(result.returncode, 2, result.stderr[-3000:])
    self.assertIn('is a file, not a directory', result.stderr)
    self.assertNotIn('Traceback', result.stderr)
    with open(path) as f:
      self.assertEqual(f.read(), 'mine')


class DamagedRunDirectoryTest(absltest.TestCase):
  """One finished 2-round run, then copies of it damaged in various ways."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = absltest.get_default_test_tmpdir()
    cls.finished = os.path.join(cls.root, 'finished')
    shutil.rmtree(cls.finished, ignore_errors=True)
    result = tff_test_utils.run_module(_flags(cls.finished))
    if result.returncode:
      raise AssertionError(result.stderr[-3000:])
    with open(os.path.join(cls.finished, 'summary.json')) as f:
      cls.summary = json.load(f)

  def _copy(self):
    out = os.path.join(self.create_tempdir().full_path, 'run')
    shutil.copytree(self.finished, out)
    return out

  def test_finished_run_only_re_evaluates(self):
    out = self._copy()
    result = tff_test_utils.run_module(_flags(out))
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('ends the run; re-evaluating only', result.stderr)
    self.assertNotIn('continuing at round 3', result.stderr)

  def test_missing_checkpoints_are_refused(self):
    out = self._copy()
    shutil.rmtree(os.path.join(out, 'checkpoints'))
    before = snapshot_lib.snapshot(out)
    result = tff_test_utils.run_module(_flags(out))
    self.assertEqual(result.returncode, 2, result.stderr[-3000:])
    self.assertIn('whose checkpoints are missing', result.stderr)
    self.assertIn('--start_over', result.stderr)
    self.assertEqual(snapshot_lib.snapshot(out), before)

  def test_damaged_latest_checkpoint_named_then_fallback(self):
    out = self._copy()
    latest = os.path.join(out, 'checkpoints', 'program_state_2')
    data = os.path.join(latest, 'variables',
                        'variables.data-00000-of-00001')
    os.truncate(data, 1000)  # A truncated checkpoint.
    before = snapshot_lib.snapshot(out)
    result = tff_test_utils.run_module(_flags(out))
    self.assertEqual(result.returncode, 2, result.stderr[-3000:])
    self.assertIn(f'The latest checkpoint {latest} (round 2) is damaged',
                  result.stderr)
    self.assertIn('--checkpoint_fallback', result.stderr)
    self.assertNotIn('Traceback', result.stderr)
    self.assertEqual(snapshot_lib.snapshot(out), before)

    with open(os.path.join(latest, 'saved_model.pb'), 'w'):
      pass  # An emptied one.
    result = tff_test_utils.run_module(_flags(out))
    self.assertEqual(result.returncode, 2, result.stderr[-3000:])
    self.assertIn(f'{latest} (round 2) is damaged', result.stderr)

    result = tff_test_utils.run_module(_flags(out, checkpoint_fallback=True))
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('Resuming from the checkpoint of round 1', result.stderr)
    self.assertTrue(os.path.isdir(latest + '_damaged'))
    with open(os.path.join(out, 'summary.json')) as f:
      self.assertEqual(json.load(f), self.summary)


if __name__ == '__main__':
  absltest.main()
