r"""Ditto, FedAvg and FedAvg + fine-tuning under user-level DP.

Fashion-MNIST split among 1,000 clients (Dirichlet(0.5), 60 examples
each: 42 training, 6 validation, 12 test), 50 clients a round (sampled
without replacement), LeNet, batch 16, client SGD at 0.05, one local
epoch, `--rounds` rounds (default 225: where FedAvg without noise passes
0.8 mean accuracy on this split). Each method trains without DP (epsilon
infinity) and with TFF's DP aggregator at each target epsilon of
`--epsilons` (the noise multiplier chosen by `--dp_target_epsilon`, delta
1/1000^1.1). Per run: the epsilon spent, the noise multiplier and the one
the updates really get (adaptive clipping spends the rest on its clipped
count), the mean and worst-10% accuracy over clients of the model each
client uses (FedAvg: the global model; Ditto: its personal model;
fine-tuning: the fine-tuned one; and each method's 'validated' choice),
and training seconds per round with its ratio to the same method's run
without DP. A target no noise reaches in `--rounds` is a row that says
so, with the smallest epsilon the run could spend.

  .venv/bin/python -m benchmarks.ditto_dp --output_dir=runs/bench_ditto_dp \
      --records_dir=benchmarks/results/ditto_dp \
      --results_file=benchmarks/results/ditto_dp.json

Every run resumes (its own directory); with `--records_dir` a finished
run leaves its row there as a record (benchmarks/run_records.py), read
back instead of training it again, so the table is built in parts:
`--methods` and `--epsilons` choose one (e.g. a process per core), and a
last invocation over everything tabulates the records. The results file is
saved after every method. The accuracy-vs-epsilon curves are TensorBoard
scalars under `<output_dir>/tensorboard` (one run per method, step =
epsilon x 100, infinity at step 10000) and a table in the results file.
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import math
import os
from typing import Any, Optional

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from benchmarks import report
from benchmarks import run_files
from benchmarks import run_records
from tff_fair.evaluation import statistics
from tff_fair.privacy import accounting
from tff_fair.runtime import local as local_runtime
from tff_fair.training import driver
from tff_fair.training import log_filter
from tff_fair.training.recipes import registry

# Method -> (algorithm, the model kind a client uses).
METHODS = {
    'fedavg': ('fedavg', 'global'),
    'ditto': ('ditto', 'personalized'),
    'fedavg_ft': ('fedavg_ft', 'fine_tuned'),
}
_NUM_CLIENTS, _CLIENTS_PER_ROUND, _EXAMPLES = 1000, 50, 60
# TensorBoard step of the run without DP.
_NO_DP_STEP = 10000

_OUTPUT_DIR = flags.DEFINE_string('output_dir', 'runs/bench_ditto_dp',
                                  'Runs and the result tables go here.')
_EPSILONS = flags.DEFINE_list('epsilons', ['1', '3', '8'],
                              'Target epsilons (besides no DP).')
_METHODS = flags.DEFINE_multi_enum(
    'methods', list(METHODS), list(METHODS), 'The methods to run.')
_ROUNDS = flags.DEFINE_integer('rounds', 225, 'Federated rounds.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of every run.')
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See docs/data.md.')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Write the results as JSON here (schema:'
    ' benchmarks/report.py), after every run.')

_COLUMNS = (
    report.Column('method', 'method'),
    report.Column('target_epsilon', 'target ε', '.0f'),
    report.Column('epsilon', 'ε spent', '.3f'),
    report.Column('noise_multiplier', 'noise', '.3f'),
    report.Column('update_noise_multiplier', 'update noise', '.2f'),
    report.Column('mean', 'mean acc.', '.4f'),
    report.Column('worst_10_mean', 'worst-10%', '.4f'),
    report.Column('validated_mean', 'validated mean', '.4f'),
    report.Column('seconds_per_round', 's/round', '.2f'),
    report.Column('round_ratio', 'x no-DP round', '.2f'),
    report.Column('note', 'note'))


def _config(method: str, target: Optional[float]):
  privacy = ({} if target is None else
             dict(aggregator='dp', dp_target_epsilon=target))
  return registry.make_config(
      algorithm=METHODS[method][0], dataset='fashion_mnist',
      partition='dirichlet', alpha=0.5, num_clients=_NUM_CLIENTS,
      clients_per_round=_CLIENTS_PER_ROUND, examples_per_client=_EXAMPLES,
      validation_fraction=0.1, test_fraction=0.2, model='lenet',
      batch_size=16, client_learning_rate=0.05, rounds=_ROUNDS.value,
      eval_every=0, seed=_SEED.value, data_dir=_DATA_DIR.value,
      output_dir=os.path.join(_OUTPUT_DIR.value, _name(method, target)),
      **privacy)


def _name(method: str, target: Optional[float]) -> str:
  return os.path.join(method, 'no_dp' if target is None else f'eps{target:g}')


def _unreachable(method: str, target: float) -> Optional[dict[str, Any]]:
  """A row for a target no noise the DP aggregator takes reaches, or None."""
  delta = accounting.default_delta(_NUM_CLIENTS)
  try:
    accounting.noise_for_epsilon(target, _CLIENTS_PER_ROUND, _NUM_CLIENTS,
                                 _ROUNDS.value, delta)
    return None
  except ValueError:
    smallest = accounting.smallest_epsilon(_CLIENTS_PER_ROUND, _NUM_CLIENTS,
                                           _ROUNDS.value, delta)
    return dict(method=method, target_epsilon=target,
                note=f'unreachable in {_ROUNDS.value} rounds: at least'
                f' {smallest:.3g}')


def _run(method: str, target: Optional[float]) -> dict[str, Any]:
  """The run's row: from its record, or trained (resumed) and recorded."""
  if target is not None and (row := _unreachable(method, target)):
    logging.info('Not run: %s at epsilon %g is %s.', method, target,
                 row['note'])
    return row
  settings = dict(method=method, target_epsilon=target,
                  rounds=_ROUNDS.value, seed=_SEED.value,
                  num_clients=_NUM_CLIENTS,
                  clients_per_round=_CLIENTS_PER_ROUND,
                  examples_per_client=_EXAMPLES)
  name = _name(method, target)
  config = _config(method, target)
  row = run_records.recorded(
      name, settings,
      lambda: None if run_files.left_out(config.output_dir, config.rounds)
      else _trained_row(method, target, config))
  return row or dict(method=method, target_epsilon=target,
                     note='not finished')


def _trained_row(method: str, target: Optional[float],
                 config) -> dict[str, Any]:
  result = driver.run(config)

  def stats(kind):
    return statistics.summarize(
        [m.accuracy for m in result.evaluations[kind].values()])

  used = stats(METHODS[method][1])
  chosen = stats('validated' if 'validated' in result.evaluations
                 else METHODS[method][1])
  private = config.aggregator == 'dp'
  return dict(
      method=method, target_epsilon=target,
      epsilon=config.privacy_epsilon(config.rounds) if private else None,
      noise_multiplier=config.dp_noise_multiplier if private else None,
      update_noise_multiplier=(accounting.update_noise_multiplier(
          config.dp_noise_multiplier, config.clients_per_round)
                               if private else None),
      mean=used.mean, worst_10_mean=used.worst_10_mean,
      validated_mean=chosen.mean,
      seconds_per_round=run_files.seconds_per_round(config.output_dir),
      note=_divergence_note(config.output_dir))


def _divergence_note(output_dir: str) -> Optional[str]:
  diverged = run_files.diverged_round(output_dir)
  return None if diverged is None else (
      f'diverged: training loss not finite from round {diverged}')


def main(argv):
  del argv
  log_filter.keep_info_logs_of_tff_fair_only()
  targets = [float(e) for e in _EPSILONS.value]
  if any(not (math.isfinite(t) and t > 0) for t in targets):
    raise app.UsageError(f'--epsilons must be numbers > 0, got'
                         f' {_EPSILONS.value}.')
  results = report.Results('ditto_dp', {
      f.name: f.value for f in (_OUTPUT_DIR, _EPSILONS, _METHODS, _ROUNDS,
                                _SEED, _DATA_DIR, run_records.RECORDS_DIR)})
  rows = []
  writer = tf.summary.create_file_writer(
      os.path.join(_OUTPUT_DIR.value, 'tensorboard'))
  with local_runtime.local_context():
    for method in _METHODS.value:
      baseline = _run(method, None)
      method_rows = [baseline] + [_run(method, t) for t in targets]
      for row in method_rows:
        row['round_ratio'] = (
            row['seconds_per_round'] / baseline['seconds_per_round']
            if row.get('seconds_per_round')
            and baseline.get('seconds_per_round') else None)
        if row.get('mean') is None:
          continue
        step = (_NO_DP_STEP if row['target_epsilon'] is None
                else int(round(100 * row['target_epsilon'])))
        with writer.as_default():
          tf.summary.scalar(f'{method}/mean_accuracy_vs_epsilon_x100',
                            row['mean'], step=step)
      rows.extend(method_rows)
      for row in method_rows:
        logging.info('%s', '  '.join(f'{k}={v}' for k, v in row.items()))
      results.table('epsilons', 'Accuracy of the model each client uses, by'
                    ' target epsilon (none: no DP)', _COLUMNS, rows)
      results.save(_RESULTS_FILE.value)
  writer.flush()
  results.write(_RESULTS_FILE.value)


if __name__ == '__main__':
  app.run(main)
