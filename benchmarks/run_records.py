"""Finished runs' figures, kept as small JSON files beside the results.

A long benchmark (hours of runs on a 2-core machine) is built in parts,
across sessions whose run directories do not survive: each finished run
leaves a record (its settings and figures) under a records directory that
is committed with the results, and a later invocation reads a run's
record instead of training it again. A record whose settings differ from
the run asked for (another number of rounds, another seed) is not used:
the run trains again and its new record replaces the old one. A record
names the machine it was measured on; a results file lists the machines of
the records it read (report.py's 'record_machines').

Plain Python, no TensorFlow.
"""

import json
import os
from typing import Any, Callable, Mapping, Optional

from absl import flags
from absl import logging

from benchmarks import report
from tff_fair import files


RECORDS_DIR = flags.DEFINE_string(
    'records_dir', '', 'Keep each finished run\'s figures here and read them'
    ' back instead of training the run again; commit them with the results'
    ' to build a table across sessions (benchmarks/run_records.py).')


def _path(records_dir: str, name: str) -> str:
  return os.path.join(records_dir, name + '.json')


def load(records_dir: str, name: str,
         settings: Mapping[str, Any]) -> Optional[dict[str, Any]]:
  """The figures recorded for run `name` with exactly `settings`, or None.

  None also when `records_dir` is '' (records off), when there is no
  record, or when the record's settings differ (said in the log).
  """
  if not records_dir:
    return None
  path = _path(records_dir, name)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    record = json.load(f)
  if record['settings'] != json.loads(json.dumps(dict(settings))):
    logging.info('Record %s is of other settings (%s, not %s): runs again.',
                 path, record['settings'], dict(settings))
    return None
  if 'machine' in record:
    report.note_record_machine(record['machine'])
  return record['figures']


def save(records_dir: str, name: str, settings: Mapping[str, Any],
         figures: Mapping[str, Any]) -> None:
  """Records run `name`'s figures (atomically); nothing when records are
  off (`records_dir` '')."""
  if not records_dir:
    return
  path = _path(records_dir, name)
  record = dict(settings=dict(settings), figures=dict(figures),
                machine=report.machine())
  files.write_atomically(
      path, lambda f: json.dump(record, f, indent=1, sort_keys=True))


def recorded(name: str, settings: Mapping[str, Any],
             compute: Callable[[], Optional[dict[str, Any]]]
             ) -> Optional[dict[str, Any]]:
  """Run `name`'s figures from its record under --records_dir, or from
  `compute()` (then recorded; None, e.g. a run left out, is not)."""
  records_dir = RECORDS_DIR.value
  if figures := load(records_dir, name, settings):
    return figures
  figures = compute()
  if figures is not None:
    save(records_dir, name, settings, figures)
  return figures
