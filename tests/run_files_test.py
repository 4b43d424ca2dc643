"""What benchmarks read from a run's files: round time, divergence, and
whether a finished run needs running again."""

import csv
import json
import os

from absl.testing import absltest

from benchmarks import run_files


class RunFilesTest(absltest.TestCase):

  def _write(self, rows):
    folder = self.create_tempdir().full_path
    with open(os.path.join(folder, 'metrics.csv'), 'w', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=list(rows[0]))
      writer.writeheader()
      writer.writerows(rows)
    return folder

  def test_round_time_is_the_median_after_the_traced_first_round(self):
    folder = self._write([
        dict(round=r, seconds_train=s, train_loss=1.0)
        for r, s in ((1, 30.0), (2, 5.0), (3, 7.0), (4, 6.0))])
    self.assertEqual(run_files.seconds_per_round(folder), 6.0)
    self.assertTrue(run_files.finished(folder, 4))
    self.assertFalse(run_files.finished(folder, 5))

  def test_the_first_round_of_a_non_finite_loss_is_the_divergence(self):
    folder = self._write([
        dict(round=r, seconds_train=1.0, train_loss=loss)
        for r, loss in ((1, 2.3), (2, 1.7e29), (3, 'nan'), (4, 'inf'))])
    self.assertEqual(run_files.diverged_round(folder), 3)
    sound = self._write([dict(round=1, seconds_train=1.0, train_loss=2.3)])
    self.assertIsNone(run_files.diverged_round(sound))
    # A recipe that logs no training loss never counts as diverged.
    silent = self._write([dict(round=1, seconds_train=1.0)])
    self.assertIsNone(run_files.diverged_round(silent))
    self.assertIsNone(run_files.diverged_round(self.create_tempdir().full_path))

  def test_a_finished_run_is_run_again_only_for_other_settings(self):
    folder = self.create_tempdir().full_path
    calls = []

    def run(tag):
      return lambda: calls.append(tag)

    a = dict(rounds=2, widths=(0.5, 1.0))
    seconds = run_files.run_unless_finished(folder, a, run('a'))
    # Same settings (a tuple read back as a list is the same): not run, and
    # the finishing call's time is read back.
    self.assertEqual(run_files.run_unless_finished(
        folder, dict(widths=[0.5, 1.0], rounds=2), run('again')), seconds)
    self.assertEqual(calls, ['a'])

    # Other settings interrupted: the files may be theirs now, so the
    # first settings run again, then stand.
    def interrupted():
      calls.append('b')
      raise KeyboardInterrupt
    with self.assertRaises(KeyboardInterrupt):
      run_files.run_unless_finished(folder, dict(rounds=3), interrupted)
    self.assertFalse(os.path.exists(
        os.path.join(folder, run_files.FINISHED_MARK)))
    run_files.run_unless_finished(folder, a, run('a2'))
    run_files.run_unless_finished(folder, a, run('a3'))
    self.assertEqual(calls, ['a', 'b', 'a2'])
    mark = os.path.join(folder, run_files.FINISHED_MARK)
    with open(mark) as f:
      self.assertEqual(json.load(f)['settings'],
                       dict(rounds=2, widths=[0.5, 1.0]))
    # A mark of another form is stale: the run runs.
    with open(mark, 'w') as f:
      json.dump(dict(rounds=2, widths=[0.5, 1.0]), f)
    run_files.run_unless_finished(folder, a, run('a4'))
    self.assertEqual(calls, ['a', 'b', 'a2', 'a4'])


if __name__ == '__main__':
  absltest.main()
