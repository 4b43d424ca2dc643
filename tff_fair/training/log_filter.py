"""Keeps a run's log readable: tff_fair's INFO lines, everyone's warnings.

TensorFlow and TFF log every SavedModel write and model wrap at INFO, which
buries the one progress line per round. Importing TFF installs a root
`StreamHandler`, so the filter goes on every handler that may print.
"""

import logging
import os

# The folders of our own code, as full paths: a checkout is often itself
# called tff_fair, and its .venv (TFF's own modules) sits inside it.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_OWN_DIRS = tuple(os.path.join(_ROOT, name) + os.sep
                  for name in ('tff_fair', 'programs', 'benchmarks'))


def _keep(record: logging.LogRecord) -> bool:
  return (record.levelno >= logging.WARNING or
          os.path.abspath(record.pathname).startswith(_OWN_DIRS))


def keep_info_logs_of_tff_fair_only() -> None:
  """Drops other libraries' INFO (and lower) records from every handler."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top

  handlers = set(logging.getLogger().handlers)
  handlers.update(logging.getLogger('tensorflow').handlers)
  handlers.add(absl_logging.get_absl_handler())
  for handler in handlers:
    handler.addFilter(_keep)
