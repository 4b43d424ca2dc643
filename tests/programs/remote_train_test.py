"""The train program on a remote worker that dies mid-run, then resumes."""

import os
import re
import subprocess
import time

from absl.testing import absltest
import portpicker

from tests import tff_test_utils


def _flags(output_dir, port, rounds):
  return tff_test_utils.module_command(
      'programs.train', algorithm='ditto', dataset='digits',
      num_clients=4, clients_per_round=3,
      rounds=rounds, batch_size=16, seed=3, eval_every=0,
      output_dir=output_dir, executor='remote', workers=f'localhost:{port}')


def _latest_checkpoint(output_dir):
  names = os.listdir(os.path.join(output_dir, 'checkpoints'))
  return max(int(re.fullmatch(r'program_state_(\d+)', n).group(1))
             for n in names if re.fullmatch(r'program_state_\d+', n))


class RemoteTrainProgramTest(absltest.TestCase):

  def test_lost_worker_is_named_fast_and_run_resumes_after_restart(self):
    port = portpicker.pick_unused_port()
    worker = tff_test_utils.start_worker(port)
    self.addCleanup(lambda: tff_test_utils.stop_worker(worker))
    out = self.create_tempdir().full_path
    program = subprocess.Popen(
        _flags(out, port, rounds=100), stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL, text=True,
        env=tff_test_utils.subprocess_env())
    self.addCleanup(program.kill)
    for line in program.stderr:
      if 'round 2/100' in line:
        worker.kill()
        killed_at = time.monotonic()
        break
    stderr = program.stderr.read()
    program.wait(timeout=60)
    self.assertLess(time.monotonic() - killed_at, 30)
    self.assertEqual(program.returncode, 3, stderr[-3000:])
    self.assertIn(f'TFF worker localhost:{port} stopped answering', stderr)
    self.assertIn('re-run the same command', stderr)

    worker = tff_test_utils.start_worker(port)  # Restarted on its port.
    saved = _latest_checkpoint(out)
    self.assertIn(saved, (2, 3))
    resumed = subprocess.run(
        _flags(out, port, rounds=saved + 1), capture_output=True, text=True,
        env=tff_test_utils.subprocess_env(), timeout=300, check=False)
    self.assertEqual(resumed.returncode, 0, resumed.stderr[-3000:])
    self.assertIn(f'Resuming from the checkpoint of round {saved}',
                  resumed.stderr)
    self.assertIn(f'round {saved + 1}/{saved + 1}', resumed.stderr)
    self.assertEqual(_latest_checkpoint(out), saved + 1)

  def test_unreachable_worker_exits_with_a_clear_error(self):
    port = portpicker.pick_unused_port()
    start = time.monotonic()
    result = subprocess.run(
        _flags(self.create_tempdir().full_path, port, rounds=1),
        capture_output=True, text=True, env=tff_test_utils.subprocess_env(),
        timeout=120, check=False)
    self.assertLess(time.monotonic() - start, 60)
    self.assertEqual(result.returncode, 3, result.stderr[-3000:])
    self.assertIn(f'TFF worker localhost:{port} did not accept a connection',
                  result.stderr)


if __name__ == '__main__':
  absltest.main()
