"""The train program as a user runs it: kill, resume, refuse, report."""

import json
import os
import re
import signal
import subprocess
import time

from absl.testing import absltest
import numpy as np
import psutil

from tests import tff_test_utils


def _flags(output_dir, **overrides):
  return tff_test_utils.train_command(
      output_dir, **{'clients_per_round': 3, 'rounds': 4, **overrides})


def _summary(output_dir):
  with open(os.path.join(output_dir, 'summary.json')) as f:
    return json.load(f)


def _workers_of(pid):
  return [p.pid for p in psutil.Process(pid).children(recursive=True)
          if 'worker_binary' in ' '.join(p.cmdline())]


class TrainProgramTest(absltest.TestCase):

  def test_killed_run_resumes_and_matches_uninterrupted_run(self):
    straight_dir = self.create_tempdir().full_path
    straight = tff_test_utils.run_module(_flags(straight_dir))
    self.assertEqual(straight.returncode, 0, straight.stderr[-3000:])
    progress = re.findall(r'round (\d)/4  loss=[\d.]+  acc=[\d.]+  '
                          r'[\d.]+ s/round  ETA \d+:\d\d:\d\d',
                          straight.stderr)
    self.assertEqual(progress, ['1', '2', '3', '4'])
    self.assertIn('worst_10_mean', straight.stderr)  # The final table.

    killed_dir = self.create_tempdir().full_path
    driver = subprocess.Popen(_flags(killed_dir), stderr=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, text=True,
                              env=tff_test_utils.subprocess_env())
    self.addCleanup(driver.kill)
    for line in driver.stderr:
      if 'round 2/4' in line:
        workers = _workers_of(driver.pid)
        driver.send_signal(signal.SIGKILL)
        break
    driver.wait(timeout=60)
    self.assertNotEmpty(workers)
    deadline = time.monotonic() + 10
    while (any(map(tff_test_utils.process_is_running, workers)) and
           time.monotonic() < deadline):
      time.sleep(0.1)
    self.assertFalse(any(map(tff_test_utils.process_is_running, workers)),
                     'a TFF worker outlived the killed program')

    resumed = tff_test_utils.run_module(_flags(killed_dir))
    self.assertEqual(resumed.returncode, 0, resumed.stderr[-3000:])
    match = re.search(r'Resuming from the checkpoint of round (\d)',
                      resumed.stderr)
    self.assertIsNotNone(match, resumed.stderr[-3000:])
    self.assertIn(match.group(1), ('2', '3'))  # Killed during round 3.
    self.assertNotIn('round 1/4', resumed.stderr)

    a, b = _summary(straight_dir), _summary(killed_dir)
    for metric in ('loss', 'accuracy', 'balanced_accuracy'):
      np.testing.assert_allclose(
          [a['global'][metric][k] for k in ('mean', 'min', 'variance')],
          [b['global'][metric][k] for k in ('mean', 'min', 'variance')],
          rtol=1e-4, atol=1e-7)

  def test_other_configuration_is_refused_and_run_kept(self):
    out = self.create_tempdir().full_path
    first = tff_test_utils.run_module(_flags(out, rounds=1))
    self.assertEqual(first.returncode, 0, first.stderr[-3000:])
    with open(os.path.join(out, 'config.json')) as f:
      saved = f.read()
    checkpoints = sorted(os.listdir(os.path.join(out, 'checkpoints')))

    other = tff_test_utils.run_module(
        _flags(out, rounds=1, num_clients=5, seed=4))
    self.assertEqual(other.returncode, 2)
    self.assertIn('num_clients: saved run has 4, this run asks 5',
                  other.stderr)
    self.assertIn('seed: saved run has 3, this run asks 4', other.stderr)
    self.assertIn('choose a new --output_dir', other.stderr)
    with open(os.path.join(out, 'config.json')) as f:
      self.assertEqual(f.read(), saved)
    self.assertEqual(sorted(os.listdir(os.path.join(out, 'checkpoints'))),
                     checkpoints)

  def test_bad_inputs_get_clear_errors(self):
    out = self.create_tempdir().full_path
    cases = [
        (dict(alpha=-1), 'alpha must be > 0'),
        (dict(clients_per_round=9), 'exceeds num_clients=4'),
        (dict(dataset='mnist', data_dir=out), 'mnist'),
        (dict(dataset='imagenet'), 'Unknown dataset'),
        (dict(algorithm='ditto', ditto_lambda=-1), 'lambda must be'),
        (dict(algorithm='ditto', ditto_lambda_grid='0.1,nan'),
         'lambda must be'),
        (dict(algorithm='aequa', p_min=0.9, p_max=0.5), 'exceeds p_max'),
        (dict(algorithm='aequa', p_max=1.5), r'Widths must be in (0, 1]'),
    ]
    for i, (overrides, message) in enumerate(cases):
      run_dir = os.path.join(out, f'run{i}')
      result = tff_test_utils.run_module(_flags(run_dir, **overrides))
      self.assertEqual(result.returncode, 2, (overrides, result.stderr[-2000:]))
      self.assertIn(message, result.stderr, overrides)
      self.assertNotIn('Traceback', result.stderr, overrides)
      # A run that failed its checks leaves no half-made output behind.
      self.assertFalse(os.path.exists(os.path.join(run_dir, 'config.json')))


if __name__ == '__main__':
  absltest.main()
