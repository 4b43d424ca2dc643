"""What a run reports: phase seconds, and summaries of every client group."""

import csv
import json
import os
import time

from absl.testing import absltest

from tff_fair.evaluation import per_client
from tff_fair.training import reports


def _metrics(accuracy):
  return per_client.ClientMetrics(num_examples=10, loss=1.0 - accuracy,
                                  accuracy=accuracy,
                                  balanced_accuracy=accuracy)


class PhaseTimerTest(absltest.TestCase):

  def test_phases_add_up_in_first_run_order(self):
    timer = reports.PhaseTimer()
    with timer.phase('train'):
      time.sleep(0.05)
    with timer.phase('data'):
      pass
    with timer.phase('train'):
      time.sleep(0.05)
    released = timer.released()
    self.assertEqual(list(released), ['seconds_train', 'seconds_data'])
    self.assertGreaterEqual(released['seconds_train'], 0.1)
    self.assertLess(released['seconds_data'], 0.05)

  def test_a_failing_phase_still_counts(self):
    timer = reports.PhaseTimer()
    with self.assertRaises(KeyError):
      with timer.phase('evaluation'):
        time.sleep(0.02)
        raise KeyError('x')
    self.assertGreaterEqual(timer.released()['seconds_evaluation'], 0.02)


class WriteFinalTest(absltest.TestCase):

  def test_a_kind_without_malicious_clients_is_summarized(self):
    # The attacker never trained a personal model: 'personalized' holds
    # benign clients only, and the run's summary must still be written.
    out = self.create_tempdir().full_path
    evaluations = {
        'global': {'a': _metrics(0.5), 'b': _metrics(0.7)},
        'personalized': {'a': _metrics(0.9)},
    }
    reports.write_final(out, evaluations, malicious=['b'])
    with open(os.path.join(out, 'summary.json')) as f:
      summary = json.load(f)
    self.assertEqual(
        sorted(summary), ['global', 'global:benign', 'global:malicious',
                          'personalized', 'personalized:benign'])
    self.assertEqual(summary['personalized:benign']['accuracy']['count'], 1)
    self.assertAlmostEqual(
        summary['global:malicious']['accuracy']['mean'], 0.7)
    with open(os.path.join(out, 'clients_final.csv')) as f:
      self.assertEqual(f.readline().split(',')[:3],
                       ['model', 'client', 'malicious'])

  def test_rotated_clients_get_a_column_and_groups(self):
    out = self.create_tempdir().full_path
    evaluations = {'global': {'a': _metrics(0.5), 'b': _metrics(0.7),
                              'c': _metrics(0.8)}}
    reports.write_final(out, evaluations, rotated=['a', 'c'])
    with open(os.path.join(out, 'summary.json')) as f:
      summary = json.load(f)
    self.assertEqual(sorted(summary),
                     ['global', 'global:rotated', 'global:upright'])
    self.assertAlmostEqual(summary['global:rotated']['accuracy']['mean'],
                           0.65)
    with open(os.path.join(out, 'clients_final.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertEqual([r['rotated'] for r in rows], ['1', '0', '1'])
    self.assertEqual([r['malicious'] for r in rows], ['0', '0', '0'])


if __name__ == '__main__':
  absltest.main()
