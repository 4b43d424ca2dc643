"""What a run reports: per-round values, per-client tables, summaries.

`clients_final.csv` (one row per model kind and client) and `summary.json`
(statistics over clients per model kind, and over benign and malicious
clients apart when an attack is on) after the last round; per round, the
flattened training metrics and statistics of a per-client evaluation.
"""

from collections.abc import Iterator, Mapping, Sequence
import contextlib
import csv
import dataclasses
import json
import os
import time
from typing import Any, Optional

from absl import logging
import numpy as np

from tff_fair import files
from tff_fair.evaluation import per_client

ClientMetrics = per_client.ClientMetrics
TRAIN_PREFIX = 'client_work/train/'


def flatten(metrics: Mapping[str, Any], prefix: str = '') -> dict[str, float]:
  """Nested metrics as {'a/b/c': value}, scalars only."""
  flat = {}
  for key, value in metrics.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      flat.update(flatten(value, name + '/'))
    elif np.ndim(value) == 0:
      flat[name] = float(value)
  return flat


def training_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
  """A round's released metrics of `next`.

  The clients' training metrics as `train_<name>`; every other scalar
  measurement of the process's parts under its path joined by '_' (e.g.
  `aggregator_zeroing_clipping_norm` of a robust aggregator,
  `finalizer_update_non_finite`), so what an aggregator or a server
  optimizer did shows in metrics.csv and TensorBoard.
  """
  return {(k.replace(TRAIN_PREFIX, 'train_') if k.startswith(TRAIN_PREFIX)
           else k.replace('/', '_')): v for k, v in flatten(metrics).items()}


def format_duration(seconds: float) -> str:
  """H:MM:SS."""
  seconds = int(round(seconds))
  return f'{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'


class PhaseTimer:
  """Wall-clock seconds of a round's phases, released as `seconds_<phase>`.

  So a user sees where a round's time goes (building client data, training,
  evaluation, checkpoints) in `metrics.csv` without a profiler.

      timer = PhaseTimer()
      with timer.phase('train'):
        ...
      released.update(timer.released())
  """

  def __init__(self):
    self._seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def phase(self, name: str) -> Iterator[None]:
    """Adds the seconds spent in the `with` block to phase `name`."""
    start = time.monotonic()
    try:
      yield
    finally:
      self._seconds[name] = (self._seconds.get(name, 0.0)
                             + time.monotonic() - start)

  def released(self) -> dict[str, float]:
    """`{'seconds_<phase>': seconds}` in the order phases first ran."""
    return {f'seconds_{name}': s for name, s in self._seconds.items()}


def test_statistics(
    prefix: str, metrics: Mapping[str, ClientMetrics]
) -> tuple[dict[str, float], np.ndarray]:
  """Released statistics of per-client test metrics, and the accuracies.

  Returns:
    (`<prefix>test_accuracy_*` statistics and `<prefix>test_loss_mean`,
    every client's accuracy as an array, for a TensorBoard histogram).
  """
  stats = per_client.summarize_clients(metrics)
  released = stats['accuracy'].as_dict(f'{prefix}test_accuracy_')
  released[f'{prefix}test_loss_mean'] = stats['loss'].mean
  return released, np.array([m.accuracy for m in metrics.values()],
                            np.float32)


def privacy(config: Any, rounds: int) -> dict[str, float]:
  """The DP aggregator's guarantee after `rounds`, to release (else {}).

  `dp_epsilon` at `dp_delta` for the global model and everything derived
  from it (`privacy.accounting`), and the noise multiplier it used.
  """
  if config.aggregator != 'dp':
    return {}
  return {'dp_epsilon': config.privacy_epsilon(rounds),
          'dp_delta': config.dp_delta,
          'dp_noise_multiplier': config.dp_noise_multiplier}


def write_final(
    output_dir: str,
    evaluations: Mapping[str, Mapping[str, ClientMetrics]],
    malicious: Sequence[str] = (),
    privacy: Optional[Mapping[str, float]] = None,
    rotated: Sequence[str] = (),
) -> None:
  """clients_final.csv and summary.json; logs a table per model kind.

  A client's row says whether it is malicious, and, in a run that rotates
  some clients' images (`--rotated_client_fraction`), whether it is
  rotated; summary.json adds each model kind's statistics over each side
  of those groups (`<kind>:benign` / `<kind>:malicious`, `<kind>:upright`
  / `<kind>:rotated`). `privacy` (`privacy`'s release) goes to
  summary.json under 'privacy'.
  """
  malicious = frozenset(malicious)
  # Column -> (its members, the summary groups without and with them).
  groupings = {'malicious': (malicious, 'benign', 'malicious')}
  if rotated:
    groupings['rotated'] = (frozenset(rotated), 'upright', 'rotated')
  fields = ['model', 'client', *groupings, 'num_examples', 'loss',
            'accuracy', 'balanced_accuracy']

  def write_csv(f):
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    for kind, metrics in evaluations.items():
      for cid, m in metrics.items():
        writer.writerow({'model': kind, 'client': cid,
                         **{column: int(cid in members) for column,
                            (members, _, _) in groupings.items()},
                         **dataclasses.asdict(m)})

  files.write_atomically(os.path.join(output_dir, 'clients_final.csv'),
                         write_csv)
  summary = {}
  for kind, metrics in evaluations.items():
    groups = {kind: metrics}
    for members, outside, inside in groupings.values():
      if members:
        groups[f'{kind}:{outside}'] = {
            c: m for c, m in metrics.items() if c not in members}
        groups[f'{kind}:{inside}'] = {
            c: m for c, m in metrics.items() if c in members}
    for name, group in groups.items():
      if not group:  # E.g. no attacker ever trained a personal model.
        continue
      summary[name] = {
          metric: dataclasses.asdict(stats) for metric, stats in
          per_client.summarize_clients(group).items()}
  if privacy:
    summary['privacy'] = dict(privacy)
    logging.info(
        'The global model (and all derived from it) is (%.4g, %.3g)-DP for'
        ' each client\'s whole data (user level), by the RDP accountant for'
        ' this run\'s sampling (docs/privacy.md says what is covered).',
        privacy['dp_epsilon'], privacy['dp_delta'])
  files.write_atomically(os.path.join(output_dir, 'summary.json'),
                         lambda f: json.dump(summary, f, indent=2))
  for kind, metrics in evaluations.items():
    shown = {c: m for c, m in metrics.items() if c not in malicious}
    if not shown:
      continue
    logging.info(
        'Per-client test metrics of the %s model(s)%s:\n%s', kind,
        ' (benign clients)' if malicious else '',
        per_client.format_table(shown))
