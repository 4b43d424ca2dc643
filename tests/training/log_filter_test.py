"""tff_fair's INFO lines pass the filter; other libraries' only from WARNING."""

import logging
import os

from absl.testing import absltest

from tff_fair.training import log_filter

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(log_filter.__file__))))


def _record(path: str, level: int = logging.INFO) -> logging.LogRecord:
  return logging.LogRecord('x', level, path, 1, 'message', (), None)


class LogFilterTest(absltest.TestCase):

  def test_own_info_kept(self):
    for name in ('tff_fair/training/driver.py', 'programs/train.py',
                 'benchmarks/scale.py'):
      self.assertTrue(log_filter._keep(_record(os.path.join(_ROOT, name))))

  def test_other_libraries_info_dropped_even_inside_a_tff_fair_checkout(self):
    # The checkout folder is often named tff_fair, and .venv sits in it.
    tff_module = os.path.join(
        _ROOT, '.venv', 'lib', 'python3.11', 'site-packages',
        'tensorflow_federated', 'python', 'learning', 'models',
        'keras_utils.py')
    self.assertFalse(log_filter._keep(_record(tff_module)))
    self.assertFalse(log_filter._keep(
        _record('/srv/tff_fair/.venv/lib/site-packages/tf/x.py')))

  def test_warnings_of_everyone_kept(self):
    self.assertTrue(log_filter._keep(_record('/usr/lib/x.py',
                                             logging.WARNING)))


if __name__ == '__main__':
  absltest.main()
