"""What a benchmark reads back from a finished run's files, and whether a
run it asks for again must run.

Plain Python and absl, no TensorFlow: a benchmark tabulates runs finished
earlier (`--finished_only`) from their files, not from the process that
trained them.
"""

import csv
import json
import math
import os
import time
from typing import Any, Callable, Optional

from absl import flags
from absl import logging
import numpy as np

from tff_fair import files

FINISHED_ONLY = flags.DEFINE_bool(
    'finished_only', False, 'Train nothing: tabulate the runs that have'
    ' finished all --rounds, leave out (and name) the others.')


# Beside a run's files while they are those of the settings it holds.
FINISHED_MARK = 'benchmark_finished.json'


def _rounds(output_dir: str) -> list[dict[str, str]]:
  path = os.path.join(output_dir, 'metrics.csv')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return list(csv.DictReader(f))


def finished(output_dir: str, rounds: int) -> bool:
  """Whether the run in `output_dir` has trained round `rounds`; for a run
  without federated rounds (standalone), whether it wrote its results."""
  logged = _rounds(output_dir)
  if not logged:
    return os.path.exists(os.path.join(output_dir, 'summary.json'))
  return any(int(r['round']) == rounds for r in logged)


def left_out(output_dir: str, rounds: int) -> bool:
  """Whether `--finished_only` leaves the run in `output_dir` out (it has
  not finished `rounds`); says so in the log."""
  if FINISHED_ONLY.value and not finished(output_dir, rounds):
    logging.info('Left out, not finished: %s', output_dir)
    return True
  return False


def seconds_per_round(output_dir: str) -> Optional[float]:
  """The median training time of a round after round 1 (which pays for
  tracing), from metrics.csv. Training only: evaluation and checkpoints
  cost what the run's evaluation settings make them, not what the method
  does. None before round 2."""
  seconds = [float(r['seconds_train']) for r in _rounds(output_dir)
             if int(r['round']) > 1]
  return float(np.median(seconds)) if seconds else None


def diverged_round(output_dir: str) -> Optional[int]:
  """The first round whose training loss is not finite (the model has
  diverged; the driver warns of it), from metrics.csv; None if there is
  none or the run logs no training loss."""
  for r in _rounds(output_dir):
    if r.get('train_loss') and not math.isfinite(float(r['train_loss'])):
      return int(r['round'])
  return None


def run_unless_finished(output_dir: str, settings: dict[str, Any],
                        run: Callable[[], Any]) -> float:
  """Calls `run()` unless the last call on `output_dir` was one with the
  same `settings` that returned.

  A finished run asked for again is otherwise re-evaluated, which can cost
  as much as training (Aequa trains every client alone again). The mark is
  removed before `run()` and written when it returns, so while it stands
  the run's final files are those of `settings`: an interrupted run, or
  one of other settings since, runs again.

  Args:
    output_dir: The run's directory.
    settings: Everything the run's files depend on (JSON-serializable).
    run: Trains or resumes the run into `output_dir`.

  Returns:
    The wall seconds of the `run()` call that finished the run (this one,
    or the marked one read back).
  """
  mark = os.path.join(output_dir, FINISHED_MARK)
  wanted = json.loads(json.dumps(settings, sort_keys=True))
  if os.path.exists(mark):
    with open(mark) as f:
      marked = json.load(f)
    # A mark of another form (another version of this code) is stale.
    if (isinstance(marked, dict) and 'seconds' in marked
        and marked.get('settings') == wanted):
      logging.info('Finished with these settings, read back: %s',
                   output_dir)
      return marked['seconds']
    os.remove(mark)
  start = time.monotonic()
  run()
  seconds = time.monotonic() - start
  files.write_atomically(mark, lambda f: json.dump(
      dict(settings=wanted, seconds=seconds), f, indent=1))
  return seconds
