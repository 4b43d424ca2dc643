"""Shared helpers for tff_fair tests."""

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any, Sequence

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tff_fair.runtime import local as local_runtime


def tensorboard_values(logdir: str, tag: str) -> dict[int, np.ndarray]:
  """step -> value of `tag` in the event files of `logdir` (not below it).

  Scalars come back as 0-d arrays, histograms as TensorBoard's (k, 3)
  buckets of (left edge, right edge, count).
  """
  values = {}
  for name in sorted(os.listdir(logdir)):
    if 'tfevents' not in name:
      continue
    for event in tf.compat.v1.train.summary_iterator(
        os.path.join(logdir, name)):
      for value in event.summary.value:
        if value.tag == tag:
          values[event.step] = tf.make_ndarray(value.tensor)
  return values


def process_is_running(pid: int) -> bool:
  """True if `pid` exists and is not a zombie (an ended, unreaped process)."""
  try:
    with open(f'/proc/{pid}/status') as f:
      return not any(
          line.startswith('State:') and 'Z' in line.split()[1]
          for line in f
      )
  except FileNotFoundError:
    return False


def subprocess_env() -> dict[str, str]:
  """Our environment, with the repository importable (as under Bazel)."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      [os.getcwd()] + env.get('PYTHONPATH', '').split(os.pathsep))
  return env


def module_command(module: str, **flags) -> list[str]:
  """`python -m module --k=v ...`, the way users run our programs."""
  return [sys.executable, '-m', module] + [f'--{k}={v}'
                                           for k, v in flags.items()]


# A small run of programs.train on digits (bundled: no data folder needed).
DIGITS_RUN_FLAGS = dict(
    dataset='digits', partition='dirichlet', alpha=0.5, num_clients=4,
    batch_size=16, client_learning_rate=0.1, seed=3, eval_every=0)


def train_command(output_dir: str, **flags) -> list[str]:
  """`python -m programs.train` on digits; `flags` add to or override it."""
  return module_command('programs.train', **{
      **DIGITS_RUN_FLAGS, 'output_dir': output_dir, **flags})


def run_module(args: list[str], timeout: float = 600
               ) -> subprocess.CompletedProcess:
  """Runs a `module_command` to its end; its output captured as text."""
  return subprocess.run(args, capture_output=True, text=True,
                        env=subprocess_env(), timeout=timeout, check=False)


def start_worker(port: int, timeout_seconds: float = 60.0
                 ) -> subprocess.Popen:
  """Starts `programs.worker` on `port` and waits until it accepts calls."""
  from tff_fair.runtime import remote  # pylint: disable=g-import-not-at-top
  process = subprocess.Popen(
      module_command('programs.worker', port=port), env=subprocess_env(),
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    remote.wait_until_ready(remote.WorkerAddress('localhost', port), process,
                            timeout_seconds)
  except remote.WorkerUnavailableError:
    stop_worker(process)
    raise
  return process


def stop_worker(process: subprocess.Popen) -> None:
  """Ends a worker, even a stopped (SIGSTOP) one, and reaps it."""
  if process.poll() is None:
    process.send_signal(signal.SIGCONT)
    process.kill()
  process.wait()


def program_errors(stderr: str) -> list[str]:
  """The train program's logged error lines and flag-parsing errors."""
  return [line for line in stderr.splitlines()
          if (line.startswith('E') and 'train.py:' in line)
          or line.startswith('FATAL')]


def assert_refused(test: Any, result: subprocess.CompletedProcess,
                   keywords: Sequence[str], output_dir: str) -> None:
  """Fails `test` unless the program exited 2 before training, with one
  error line holding every keyword, and wrote nothing to `output_dir`."""
  test.assertEqual(result.returncode, 2, result.stderr[-3000:])
  test.assertNotIn('Traceback', result.stderr)
  test.assertNotIn('round 1/', result.stderr)
  lines = program_errors(result.stderr)
  test.assertLen(lines, 1, result.stderr[-3000:])
  for keyword in keywords:
    test.assertIn(keyword, lines[0])
  test.assertFalse(os.path.exists(output_dir))


class TffTestCase(tf.test.TestCase, parameterized.TestCase):
  """Runs each test class on one local TFF worker, ended after the class."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._runtime = contextlib.ExitStack()
    cls.worker = cls._runtime.enter_context(local_runtime.local_context())

  @classmethod
  def tearDownClass(cls):
    cls._runtime.close()
    super().tearDownClass()
