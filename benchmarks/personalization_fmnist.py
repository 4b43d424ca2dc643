r"""Personalization methods against FedAvg, as the Ditto paper compares them.

Fashion-MNIST, 20 clients with 300 training, 30 validation and 100 test
examples each, under label skew #C=2 (NIID-Bench's rule) and
Dirichlet(0.1); PFLlib's FedAvgCNN, batch 10, client SGD at 0.005, one
local epoch, every client every round, 50 rounds; seeds 0, 1, 2. Methods:
FedAvg (its global model), FedAvg + fine-tuning, FedProx, Ditto,
Per-FedAvg (first-order and Hessian-free), FedRep and pFedMe, each with
its recipe's defaults otherwise. Per method: the mean and worst-10%
accuracy over clients of the model each client gets (FedAvg's and
FedProx's global model; the personalized models of the others, and their
'validated' choice of personalized or global model on the client's
validation split), and training seconds per round (median of rounds
2..N). Runs recorded in other sessions may come from other machines and
loads (each record names its machine), so no ratio is taken between them:
`benchmarks.round_time --setting=pfllib` times the methods' rounds
against FedAvg's in one process.

Then FEMNIST's natural writer partition (`--femnist_writers` writers, the
data set's defaults: LeNet, batch 32, rate 0.1), every method with its
defaults: the case where a client's few examples of many classes make
personalization hurt, and the 'validated' choice must keep each method at
least at the global model's mean accuracy.

  .venv/bin/python -m benchmarks.personalization_fmnist \
      --output_dir=runs/bench_personalization \
      --results_file=benchmarks/results/personalization_fmnist.json

Every run goes through `tff_fair.training.driver` in its own directory, so
a killed benchmark resumes where it stopped, and one run again (e.g. with
more seeds) skips what is finished; `--seeds`, `--partitions` and
`--methods` choose a part. With `--records_dir`, a finished run leaves
its figures there (benchmarks/run_records.py) and is read back from them,
never trained again: committed with the results, they let the table be
built in parts across sessions whose run directories do not survive. The
results file is written after every run, so it always holds what has
finished. With `--finished_only` nothing trains: the table gathers the
runs recorded or finished so far and leaves the others out, naming them.
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import csv
import os
from typing import Any, Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np

from benchmarks import report
from benchmarks import run_files
from benchmarks import run_records
from tff_fair.evaluation import statistics
from tff_fair.runtime import local as local_runtime
from tff_fair.training import driver
from tff_fair.training import log_filter
from tff_fair.training.recipes import registry

# Method -> (algorithm, its settings, the model kind a client gets).
METHODS = {
    'fedavg': ('fedavg', {}, 'global'),
    'fedavg_ft': ('fedavg_ft', {}, 'fine_tuned'),
    'fedprox': ('fedprox', {}, 'global'),
    'ditto': ('ditto', {}, 'personalized'),
    'per_fedavg_fo': ('per_fedavg', {'per_fedavg_variant': 'fo'},
                      'personalized'),
    'per_fedavg_hf': ('per_fedavg', {'per_fedavg_variant': 'hf'},
                      'personalized'),
    'fedrep': ('fedrep', {}, 'personalized'),
    'pfedme': ('pfedme', {}, 'personalized'),
}
PARTITIONS = {
    'label_skew': dict(partition='label_skew', classes_per_client=2,
                       label_skew_rule='niid_bench'),
    'dirichlet': dict(partition='dirichlet', alpha=0.1),
}
# 300 train, 30 validation, 100 test examples per client.
_EXAMPLES, _VALIDATION, _TEST = 430, 30, 100

_OUTPUT_DIR = flags.DEFINE_string('output_dir', 'runs/bench_personalization',
                                  'Runs and the result tables go here.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds of the runs.')
_PARTITIONS = flags.DEFINE_list('partitions', list(PARTITIONS),
                                'Fashion-MNIST partitions.')
_METHODS = flags.DEFINE_list('methods', list(METHODS), 'Methods to run.')
_ROUNDS = flags.DEFINE_integer('rounds', 50, 'Federated rounds.')
_FEMNIST_WRITERS = flags.DEFINE_integer(
    'femnist_writers', 40, 'FEMNIST writers (clients) of the natural'
    ' partition; 0 leaves FEMNIST out.')
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See docs/data.md.')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Write the results as JSON here (schema:'
    ' benchmarks/report.py), after every run.')

_COLUMNS = (
    report.Column('setting', 'setting'), report.Column('method', 'method'),
    report.Column('seeds', 'seeds'),
    report.Column('mean', 'mean acc.', '.4f'),
    report.Column('mean_spread', '± (seeds)', '.4f'),
    report.Column('worst_10_mean', 'worst-10%', '.4f'),
    report.Column('validated_mean', 'validated mean', '.4f'),
    report.Column('validated_worst_10_mean', 'validated worst-10%', '.4f'),
    report.Column('fallback_clients', 'clients on global', '.1f'),
    report.Column('seconds_per_round', 's/round', '.2f'))


def _fmnist_config(method: str, partition: str, seed: int):
  algorithm, settings, _ = METHODS[method]
  return registry.make_config(
      algorithm=algorithm, dataset='fashion_mnist', num_clients=20,
      clients_per_round=20, examples_per_client=_EXAMPLES,
      validation_fraction=_VALIDATION / _EXAMPLES,
      test_fraction=_TEST / _EXAMPLES, model='fedavg_cnn', batch_size=10,
      client_learning_rate=0.005, local_epochs=1, rounds=_ROUNDS.value,
      eval_every=0, seed=seed, data_dir=_DATA_DIR.value,
      output_dir=os.path.join(_OUTPUT_DIR.value, partition,
                              f'seed{seed}', method),
      **PARTITIONS[partition], **settings)


def _femnist_config(method: str):
  """Every setting the data set's default but the clients and rounds."""
  algorithm, settings, _ = METHODS[method]
  return registry.make_config(
      algorithm=algorithm, dataset='femnist', partition='natural',
      num_clients=_FEMNIST_WRITERS.value,
      clients_per_round=_FEMNIST_WRITERS.value, rounds=_ROUNDS.value,
      eval_every=0, data_dir=_DATA_DIR.value,
      output_dir=os.path.join(_OUTPUT_DIR.value, 'femnist_natural', method),
      **settings)


def _fallback_clients(output_dir: str) -> Optional[int]:
  """How many clients chose the global model (personalization.csv)."""
  path = os.path.join(output_dir, 'personalization.csv')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return sum(row['uses'] == 'global' for row in csv.DictReader(f))


def _run(config, kind: str,
         settings: dict[str, Any]) -> Optional[dict[str, Any]]:
  """One run's figures (read from its record, or trained, resumed or only
  re-evaluated, then recorded); None for a run left out by
  `--finished_only`. `settings`: what the figures depend on besides the
  run's name."""
  name = os.path.relpath(config.output_dir, _OUTPUT_DIR.value)
  settings = dict(settings, rounds=_ROUNDS.value)
  return run_records.recorded(
      name, settings,
      lambda: None if run_files.left_out(config.output_dir, _ROUNDS.value)
      else _trained_figures(config, kind))


def _trained_figures(config, kind: str) -> dict[str, Any]:
  result = driver.run(config)

  def stats(name):
    accuracies = [m.accuracy for m in result.evaluations[name].values()]
    return statistics.summarize(accuracies)

  chosen = stats('validated' if 'validated' in result.evaluations
                 else kind)
  return dict(mean=stats(kind).mean, worst_10_mean=stats(kind).worst_10_mean,
              validated_mean=chosen.mean,
              validated_worst_10_mean=chosen.worst_10_mean,
              fallback_clients=_fallback_clients(config.output_dir),
              seconds_per_round=run_files.seconds_per_round(config.output_dir))


def _summary_row(setting: str, method: str,
                 by_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
  """Mean over seeds and the spread of the mean accuracy (max - min)."""
  runs = list(by_seed.values())

  def mean(key):
    values = [r[key] for r in runs if r[key] is not None]
    return float(np.mean(values)) if values else None

  means = [r['mean'] for r in runs]
  return dict(setting=setting, method=method, seeds=len(runs),
              mean=mean('mean'),
              mean_spread=max(means) - min(means) if len(runs) > 1 else None,
              worst_10_mean=mean('worst_10_mean'),
              validated_mean=mean('validated_mean'),
              validated_worst_10_mean=mean('validated_worst_10_mean'),
              fallback_clients=mean('fallback_clients'),
              seconds_per_round=mean('seconds_per_round'))


def _overview(rows: list[dict[str, Any]]
              ) -> tuple[list[report.Column], list[dict[str, Any]]]:
  """The README's table: a row per method, its mean accuracy in each
  setting (mean over seeds); on FEMNIST also its 'validated' choice's,
  the figure that must reach the global model's there."""
  columns = [report.Column('method', 'method')]
  by_method: dict[str, dict[str, Any]] = {}
  for setting in dict.fromkeys(row['setting'] for row in rows):
    key = setting.replace(' ', '_')
    seeds = max(r['seeds'] for r in rows if r['setting'] == setting)
    figures = [('mean', key, f'{setting} ({seeds} seed{"s" * (seeds > 1)})')]
    if setting.startswith('femnist'):
      figures.append(('validated_mean', f'{key}_validated',
                      f'{setting}, validated'))
    for figure, column_key, title in figures:
      columns.append(report.Column(column_key, title, '.4f'))
      for row in rows:
        by_method.setdefault(row['method'], {'method': row['method']})
        if row['setting'] == setting:
          by_method[row['method']][column_key] = row[figure]
  keys = [c.key for c in columns]
  return columns, [{k: r.get(k) for k in keys} for r in by_method.values()]


def _check_flags() -> None:
  for name, chosen, known in (('methods', _METHODS.value, METHODS),
                              ('partitions', _PARTITIONS.value, PARTITIONS)):
    unknown = sorted(set(chosen) - set(known))
    if unknown:
      raise app.UsageError(f'--{name}: unknown {", ".join(unknown)}; choose'
                           f' from {", ".join(known)}.')


def main(argv):
  del argv
  _check_flags()
  log_filter.keep_info_logs_of_tff_fair_only()
  results = report.Results('personalization_fmnist', {
      f.name: f.value for f in (_OUTPUT_DIR, _SEEDS, _PARTITIONS, _METHODS,
                                _ROUNDS, _FEMNIST_WRITERS, _DATA_DIR,
                                run_records.RECORDS_DIR,
                                run_files.FINISHED_ONLY)})
  seeds = [int(s) for s in _SEEDS.value]
  rows = []

  def release():
    """Prints the table so far and writes the results file."""
    report.print_rows(_COLUMNS, rows)
    results.table('methods', 'Mean over seeds; accuracy of the model each'
                  ' client gets', _COLUMNS, rows)
    results.table('overview', 'Mean accuracy of the model each client gets,'
                  ' over seeds', *_overview(rows))
    results.save(_RESULTS_FILE.value)

  with local_runtime.local_context():
    for partition in _PARTITIONS.value:
      runs = {method: {} for method in _METHODS.value}
      for seed in seeds:
        for method in _METHODS.value:
          logging.info('%s, seed %d: %s', partition, seed, method)
          run = _run(_fmnist_config(method, partition, seed),
                     METHODS[method][2],
                     dict(method=method, partition=partition, seed=seed))
          if run is not None:
            runs[method][seed] = run
      rows.extend(_summary_row(f'fmnist {partition}', method, runs[method])
                  for method in _METHODS.value if runs[method])
      release()
    if _FEMNIST_WRITERS.value:
      # One run per method: its row is released as soon as it finishes.
      for method in _METHODS.value:
        run = _run(_femnist_config(method), METHODS[method][2],
                   dict(method=method, writers=_FEMNIST_WRITERS.value))
        if run is not None:
          rows.append(_summary_row('femnist natural', method, {0: run}))
          release()
  results.write(_RESULTS_FILE.value)


if __name__ == '__main__':
  app.run(main)
