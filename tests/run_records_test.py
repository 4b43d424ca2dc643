"""Benchmark run records: read back only for the settings they were made
with, replaced when the settings change, off when no folder is given."""

import json
import os

from absl.testing import absltest
from absl.testing import flagsaver

from benchmarks import report
from benchmarks import run_records


class RunRecordsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.folder = self.create_tempdir().full_path
    self.settings = dict(rounds=225, seed=0, target=8.0)

  def test_a_saved_run_is_read_back_with_its_settings_only(self):
    self.assertIsNone(run_records.load(self.folder, 'ditto/eps8',
                                       self.settings))
    run_records.save(self.folder, 'ditto/eps8', self.settings,
                     dict(mean=0.81, note=None))
    self.assertEqual(
        run_records.load(self.folder, 'ditto/eps8', self.settings),
        dict(mean=0.81, note=None))
    self.assertIsNone(run_records.load(
        self.folder, 'ditto/eps8', dict(self.settings, rounds=100)))
    self.assertIsNone(run_records.load(self.folder, 'ditto/eps3',
                                       self.settings))

  def test_a_new_record_replaces_one_of_other_settings(self):
    run_records.save(self.folder, 'run', dict(rounds=100), dict(mean=0.5))
    run_records.save(self.folder, 'run', dict(rounds=225), dict(mean=0.8))
    self.assertIsNone(run_records.load(self.folder, 'run', dict(rounds=100)))
    self.assertEqual(run_records.load(self.folder, 'run', dict(rounds=225)),
                     dict(mean=0.8))
    self.assertEqual(os.listdir(self.folder), ['run.json'])

  def test_tuples_compare_as_saved(self):
    # JSON turns tuples into lists: settings given as tuples still match.
    run_records.save(self.folder, 'run', dict(seeds=(0, 1)), dict(mean=1.0))
    self.assertEqual(
        run_records.load(self.folder, 'run', dict(seeds=(0, 1))),
        dict(mean=1.0))

  def test_a_record_names_its_machine_and_the_results_list_others(self):
    run_records.save(self.folder, 'here', dict(rounds=1), dict(mean=0.5))
    path = os.path.join(self.folder, 'here.json')
    with open(path) as f:
      record = json.load(f)
    self.assertEqual(record['machine'], report.machine())
    elsewhere = dict(cpu='Other CPU', cores=64, memory_gib=512.0)
    record['machine'] = elsewhere
    with open(os.path.join(self.folder, 'there.json'), 'w') as f:
      json.dump(record, f)
    results = report.Results('test', {})
    run_records.load(self.folder, 'here', dict(rounds=1))
    self.assertNotIn(report.machine(), results.as_dict()['record_machines'])
    run_records.load(self.folder, 'there', dict(rounds=1))
    self.assertIn(elsewhere, results.as_dict()['record_machines'])
    results.write('')

  def test_recorded_computes_once_and_never_records_none(self):
    calls = []

    def compute():
      calls.append(1)
      return dict(mean=0.7)

    with flagsaver.flagsaver((run_records.RECORDS_DIR, self.folder)):
      self.assertIsNone(run_records.recorded('run', self.settings,
                                             lambda: None))
      self.assertEqual(os.listdir(self.folder), [])
      for _ in range(2):
        self.assertEqual(run_records.recorded('run', self.settings, compute),
                         dict(mean=0.7))
    self.assertLen(calls, 1)

  def test_no_folder_means_no_records(self):
    run_records.save('', 'run', self.settings, dict(mean=0.5))
    self.assertIsNone(run_records.load('', 'run', self.settings))
    self.assertEqual(os.listdir(self.folder), [])


if __name__ == '__main__':
  absltest.main()
