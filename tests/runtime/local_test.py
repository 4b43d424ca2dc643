"""The local runtime leaves no TFF worker behind, however the driver ends."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from absl.testing import absltest
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tff_fair.runtime import local as local_runtime


@tff.tensorflow.computation(tf.int32, tf.int32)
def _add(a, b):
  return a + b


_DRIVER = textwrap.dedent("""
    import sys, time
    import tensorflow as tf
    import tensorflow_federated as tff
    from tff_fair.runtime import local

    @tff.tensorflow.computation(tf.int32)
    def double(x):
      return 2 * x

    with local.local_context() as worker:
      assert double(21) == 42
      print(worker.pid, flush=True)
      time.sleep(600)
""")


def _wait_until_ended(pid: int, timeout: float = 15.0) -> bool:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if not tff_test_utils.process_is_running(pid):
      return True
    time.sleep(0.1)
  return False


class LocalRuntimeTest(absltest.TestCase):

  def test_computation_runs_and_worker_ends_with_context(self):
    with local_runtime.local_context(max_concurrent_computation_calls=2) as w:
      self.assertEqual(_add(2, 3), 5)
      pid = w.pid
      self.assertTrue(tff_test_utils.process_is_running(pid))
    self.assertTrue(_wait_until_ended(pid, timeout=5))

  def test_worker_ends_when_body_raises(self):
    with self.assertRaises(ZeroDivisionError):
      with local_runtime.local_context() as w:
        self.assertEqual(_add(1, 1), 2)
        pid = w.pid
        _ = 1 / 0
    self.assertTrue(_wait_until_ended(pid, timeout=5))

  def test_tff_still_usable_after_context(self):
    with local_runtime.local_context():
      self.assertEqual(_add(1, 2), 3)
    # The idle context left behind starts (and later ends) its own worker.
    self.assertEqual(_add(2, 2), 4)
    local_runtime.LocalWorker.close_all()

  def _start_driver(self):
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [os.getcwd()] + env.get('PYTHONPATH', '').split(os.pathsep))
    driver = subprocess.Popen(
        [sys.executable, '-c', _DRIVER], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env, text=True)
    self.addCleanup(driver.kill)
    line = driver.stdout.readline()
    self.assertTrue(line.strip().isdigit(), f'driver said {line!r}')
    return driver, int(line)

  def test_worker_ends_when_driver_is_killed(self):
    driver, worker_pid = self._start_driver()
    self.assertTrue(tff_test_utils.process_is_running(worker_pid))
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    self.assertTrue(_wait_until_ended(worker_pid),
                    f'worker {worker_pid} outlived a SIGKILLed driver')

  def test_sigterm_unwinds_and_ends_worker(self):
    driver, worker_pid = self._start_driver()
    driver.send_signal(signal.SIGTERM)
    self.assertEqual(driver.wait(timeout=30), 128 + signal.SIGTERM)
    self.assertTrue(_wait_until_ended(worker_pid))


if __name__ == '__main__':
  absltest.main()
