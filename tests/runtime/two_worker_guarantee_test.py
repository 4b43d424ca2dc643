"""What a run on two remote workers guarantees, over 10 rounds of Ditto.

Several workers add up partial aggregates in another order than the local
runtime, so their numbers may drift from a local run's over rounds (docs/remote.md). What is guaranteed, and tested here on two loopback
workers: the same run on the same workers gives the same numbers, and the
train program killed (SIGKILL) in the middle of a round and resumed on them
ends exactly as the uninterrupted run.
"""

import csv
import os
import signal
import subprocess
import time

from absl.testing import absltest
import numpy as np
import portpicker
import psutil

from tests import tff_test_utils
from tff_fair.runtime import execution
from tff_fair.runtime import remote
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training.recipes import registry

_ROUNDS = 10
# Killed in round _KILLED_IN, once it has written personal models (before
# its checkpoint: the "two writes" window), so it resumes from the round
# before.
_KILLED_IN = 6
_SETTINGS = dict(
    algorithm='ditto', dataset='digits', partition='dirichlet',
    num_clients=6, clients_per_round=4, rounds=_ROUNDS, batch_size=16,
    client_learning_rate=0.1, seed=5, eval_every=0)
_TIMEOUT_SECONDS = 600


def _read(path):
  with open(path) as f:
    return f.read()


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _has_personal_models_of(output_dir, round_num):
  """Whether any client's personal model of `round_num` is on disk."""
  name = f'v{round_num}.npz'
  for _, _, names in os.walk(os.path.join(output_dir, 'personal', 'clients')):
    if name in names:
      return True
  return False


def _end(processes):
  """Kills and reaps the processes of `processes` still running."""
  for process in processes:
    try:
      process.kill()
      process.wait(timeout=30)
    except (psutil.NoSuchProcess, ProcessLookupError):
      pass


class TwoWorkerGuaranteeTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    addresses = []
    for _ in range(2):
      port = portpicker.pick_unused_port()
      process = tff_test_utils.start_worker(port)
      self.addCleanup(tff_test_utils.stop_worker, process)
      addresses.append(str(remote.WorkerAddress('localhost', port)))
    self.workers = ','.join(addresses)

  def _command(self, output_dir):
    return tff_test_utils.train_command(
        output_dir, executor='remote', workers=self.workers, **_SETTINGS)

  def _wait_for(self, condition, program, log_path, what):
    deadline = time.monotonic() + _TIMEOUT_SECONDS
    while not condition():
      if program.poll() is not None:
        self.fail(f'The program ended (status {program.returncode}) before'
                  f' {what}:\n{_read(log_path)[-3000:]}')
      if time.monotonic() > deadline:
        self.fail(f'No {what} after {_TIMEOUT_SECONDS} s:\n'
                  f'{_read(log_path)[-3000:]}')
      time.sleep(0.05)

  def _kill_mid_round(self, output_dir):
    """Starts the program and SIGKILLs it in round `_KILLED_IN`."""
    log_path = os.path.join(self.create_tempdir().full_path, 'stderr.txt')
    # A file, not a pipe: a pipe left unread could block the program.
    with open(log_path, 'w') as log:
      program = subprocess.Popen(
          self._command(output_dir), stdout=subprocess.DEVNULL, stderr=log,
          env=tff_test_utils.subprocess_env())
    self.addCleanup(_end, [program])
    self._wait_for(
        lambda: f'round {_KILLED_IN - 1}/{_ROUNDS}' in _read(log_path),
        program, log_path, f'round {_KILLED_IN - 1}')
    self._wait_for(
        lambda: _has_personal_models_of(output_dir, _KILLED_IN), program,
        log_path, f'personal models of round {_KILLED_IN}')
    children = psutil.Process(program.pid).children(recursive=True)
    self.addCleanup(_end, children)  # Should they outlive the program.
    program.send_signal(signal.SIGKILL)
    program.wait(timeout=60)
    return _read(log_path)

  def test_repeatable_and_resumable_after_kill_on_the_same_workers(self):
    config = registry.make_config(
        output_dir=self.create_tempdir().full_path, **_SETTINGS)
    with execution.execution_context('remote', self.workers):
      first = driver.run(config)
      # In the same context, an algorithm whose round returns per-client
      # values is refused before it writes anything.
      refused = registry.make_config(
          output_dir=os.path.join(self.create_tempdir().full_path, 'cgsv'),
          **{**_SETTINGS, 'algorithm': 'cgsv'})
      with self.assertRaisesRegex(config_lib.ConfigError,
                                  'cannot split its clients over 2 workers'):
        driver.run(refused)
      self.assertFalse(os.path.exists(refused.output_dir))
    losses = [h['train_loss'] for h in first.history]
    self.assertLen(losses, _ROUNDS)
    # And the run learned something: equal numbers of nothing prove nothing.
    self.assertLess(losses[-1], losses[0])

    out = self.create_tempdir().full_path
    killed_log = self._kill_mid_round(out)
    self.assertNotIn(f'round {_KILLED_IN}/{_ROUNDS}', killed_log)
    resumed = tff_test_utils.run_module(self._command(out),
                                        timeout=_TIMEOUT_SECONDS)
    self.assertEqual(resumed.returncode, 0, resumed.stderr[-3000:])
    self.assertIn(f'Resuming from the checkpoint of round {_KILLED_IN - 1} in',
                  resumed.stderr)
    self.assertIn(f'continuing at round {_KILLED_IN} of {_ROUNDS}',
                  resumed.stderr)

    # Exactly equal, not to a tolerance: rounds before the kill repeat the
    # same run on the same workers, the later ones come from the resumed
    # program (metrics.csv keeps one row a round; rerun rounds replace
    # theirs).
    rows = _rows(os.path.join(out, 'metrics.csv'))
    self.assertEqual([int(r['round']) for r in rows],
                     list(range(1, _ROUNDS + 1)))
    self.assertEqual([float(r['train_loss']) for r in rows], losses)
    final = _rows(os.path.join(out, 'clients_final.csv'))
    for kind in ('global', 'personalized'):
      expected = {cid: m.accuracy for cid, m in first.evaluations[kind].items()}
      got = {r['client']: float(r['accuracy']) for r in final
             if r['model'] == kind}
      self.assertEqual(list(got), list(expected), kind)
      np.testing.assert_array_equal(list(got.values()),
                                    list(expected.values()), err_msg=kind)


if __name__ == '__main__':
  absltest.main()
