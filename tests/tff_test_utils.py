"""Shared helpers for tff_fair tests."""

import contextlib
import os

from absl.testing import parameterized
import tensorflow as tf

from tff_fair.runtime import local as local_runtime


def data_dir() -> str:
  """The offline data folder; tests fail loudly (not skip) without it."""
  path = os.environ.get('TFF_FAIR_DATA_DIR', '')
  if not path or not os.path.isdir(path):
    raise RuntimeError(
        'Set TFF_FAIR_DATA_DIR to the data folder (shared/data); the test'
        ' command does this for you.'
    )
  return path


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
