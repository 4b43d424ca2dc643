"""What a benchmark reads back from a finished run's files.

Plain Python and absl, no TensorFlow: a benchmark tabulates runs finished
earlier (`--finished_only`) from their files, not from the process that
trained them.
"""

import csv
import math
import os
from typing import Optional

from absl import flags
from absl import logging
import numpy as np

FINISHED_ONLY = flags.DEFINE_bool(
    'finished_only', False, 'Train nothing: tabulate the runs that have'
    ' finished all --rounds, leave out (and name) the others.')


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
