"""Keeps a run's log readable: tff_fair's INFO lines, everyone's warnings.

TensorFlow and TFF log every SavedModel write and model wrap at INFO, which
buries the one progress line per round. Importing TFF installs a root
`StreamHandler`, so the filter goes on every handler that may print.
"""

import logging
import os

_OWN_PATHS = (os.sep + 'tff_fair' + os.sep, os.sep + 'programs' + os.sep,
              os.sep + 'benchmarks' + os.sep)


def _keep(record: logging.LogRecord) -> bool:
  return record.levelno >= logging.WARNING or any(
      part in record.pathname for part in _OWN_PATHS)


def keep_info_logs_of_tff_fair_only() -> None:
  """Drops other libraries' INFO (and lower) records from every handler."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top

  handlers = set(logging.getLogger().handlers)
  handlers.update(logging.getLogger('tensorflow').handlers)
  handlers.add(absl_logging.get_absl_handler())
  for handler in handlers:
    handler.addFilter(_keep)
