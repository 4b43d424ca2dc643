r"""Several models in one run: clustered FL, FedDF and FedMD on Fashion-MNIST.

Fashion-MNIST, 20 clients with 300 training, 30 validation and 100 test
examples each, all sampled every round, the data set's defaults (LeNet,
batch 32, client SGD at 0.05, one local epoch) and every recipe's own
defaults: the settings a user starts from.

Clustering (homogeneous partition, so the only structure is the one made
on purpose): with `--rotated_client_fraction=0.5` half the clients see
every image of theirs turned 180 degrees; the same federation without the
rotation is the control, where CFL must not split. FedAvg (its global
model), Ditto (personalized) and CFL (each client's cluster model). Per
case: mean and worst-10% accuracy of the model each client uses, the mean
over the upright and over the rotated clients, CFL's number of clusters
and their purity (the share of clients in a cluster whose majority is of
their own kind: 1.0 when every cluster is all rotated or all upright).

Distillation (Dirichlet(0.5) partition): two architectures,
`--client_models=lenet:0.5,fedavg_cnn:0.5` (LeNet and PFLlib's FedAvgCNN),
a public set of 2000 examples no client holds and a server validation set
of 500 (FedDF's early stopping). FedDF (each client with its
architecture's global model), FedMD (each client's own model), standalone
(each client's model of its architecture trained alone) and FedAvg of one
architecture (every client LeNet; every client FedAvgCNN). Per method:
mean and worst-10% accuracy over all clients, and the mean over the
clients of each architecture (the same clients in every row).

  .venv/bin/python -m benchmarks.cfl_distillation_fmnist \
      --output_dir=runs/bench_cfl_distillation \
      --results_file=benchmarks/results/cfl_distillation_fmnist.json

Every run goes through `tff_fair.training.driver` in its own directory, so
a killed benchmark resumes where it stopped and a second call skips what
is finished; `--parts` and `--seeds` choose a part. The results file is
written after every part. With `--finished_only` nothing trains: the
tables gather the runs finished so far (re-evaluated with the current
code) and name the others.
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import csv
import json
import os
from typing import Any, Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np

from benchmarks import report
from benchmarks import run_files
from tff_fair.evaluation import statistics
from tff_fair.runtime import local as local_runtime
from tff_fair.training import driver
from tff_fair.training import log_filter
from tff_fair.training.recipes import cfl
from tff_fair.training.recipes import client_architectures
from tff_fair.training.recipes import feddf
from tff_fair.training.recipes import registry

PARTS = ('clustering', 'distillation')
# Clustering: method -> (algorithm, the model kind a client uses).
CLUSTERING_METHODS = {'fedavg': ('fedavg', 'global'),
                      'ditto': ('ditto', 'personalized'),
                      'cfl': ('cfl', 'personalized')}
ROTATIONS = {'rotated_half': 0.5, 'upright': 0.0}
ARCHITECTURES = ('lenet', 'fedavg_cnn')
# Distillation: method -> (algorithm, its settings, the model kind a client
# uses). Standalone is one run per architecture, combined per client.
_TWO = {'client_models': ','.join(f'{a}:0.5' for a in ARCHITECTURES)}
_SETS = {'public_examples': 2000, 'server_held_out_examples': 500}
DISTILLATION_METHODS = {
    'feddf': ('feddf', {**_TWO, **_SETS}, 'global'),
    # The same runs without the server's distillation: FedAvg per
    # architecture, the distillation's own gain is the difference.
    'feddf_no_distillation': ('feddf', {**_TWO, **_SETS,
                                        'feddf_distillation_steps': 0},
                              'global'),
    'fedmd': ('fedmd', {**_TWO, 'public_examples': 2000}, 'personalized'),
    **{f'fedavg_{a}': ('fedavg', {'model': a}, 'global')
       for a in ARCHITECTURES},
    **{f'standalone_{a}': ('standalone', {'model': a}, 'standalone')
       for a in ARCHITECTURES},
}
# 300 train, 30 validation, 100 test examples per client.
_EXAMPLES, _VALIDATION, _TEST = 430, 30, 100

_OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', 'runs/bench_cfl_distillation',
    'Runs go here, one directory each.')
_PARTS = flags.DEFINE_list('parts', list(PARTS), 'Parts to run.')
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Seeds of the runs.')
_ROUNDS = flags.DEFINE_integer('rounds', 50, 'Federated rounds.')
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See docs/data.md.')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Write the results as JSON here (schema:'
    ' benchmarks/report.py), after every part.')

_COMMON_COLUMNS = (
    report.Column('mean', 'mean acc.', '.4f'),
    report.Column('worst_10_mean', 'worst-10%', '.4f'))
_CLUSTERING_COLUMNS = (
    report.Column('setting', 'clients'), report.Column('method', 'method'),
    report.Column('seeds', 'seeds'), *_COMMON_COLUMNS,
    report.Column('upright_mean', 'upright mean', '.4f'),
    report.Column('rotated_mean', 'rotated mean', '.4f'),
    report.Column('clusters', 'clusters', '.1f'),
    report.Column('purity', 'purity', '.3f'),
    report.Column('seconds_per_round', 's/round', '.2f'))
_DISTILLATION_COLUMNS = (
    report.Column('method', 'method'), report.Column('seeds', 'seeds'),
    *_COMMON_COLUMNS,
    *(report.Column(f'{a}_mean', f'{a} clients', '.4f')
      for a in ARCHITECTURES),
    report.Column('distillation_stopped_early', 'distillations stopped'
                  ' early', '.2f'),
    report.Column('best_step', 'mean best step', '.0f'),
    report.Column('seconds_per_round', 's/round', '.2f'))


def _config(algorithm: str, output_dir: str, seed: int, **settings):
  if registry.get(algorithm).trains_federated:
    settings['eval_every'] = 0  # Standalone has no rounds to evaluate in.
  return registry.make_config(
      algorithm=algorithm, dataset='fashion_mnist', num_clients=20,
      clients_per_round=20, examples_per_client=_EXAMPLES,
      validation_fraction=_VALIDATION / _EXAMPLES,
      test_fraction=_TEST / _EXAMPLES, rounds=_ROUNDS.value, seed=seed,
      data_dir=_DATA_DIR.value, output_dir=output_dir, **settings)


def _run(config) -> Optional[driver.RunResult]:
  """Trains, resumes or only re-evaluates `config`; None for a run left
  out by `--finished_only`."""
  if run_files.left_out(config.output_dir, _ROUNDS.value):
    return None
  return driver.run(config)


def _accuracies(result: driver.RunResult, kind: str) -> dict[str, float]:
  return {cid: m.accuracy for cid, m in result.evaluations[kind].items()}


def _group_means(accuracies: dict[str, float],
                 groups: dict[str, set[str]]) -> dict[str, Optional[float]]:
  """`<group>_mean` of each group (None for an empty one)."""
  return {f'{name}_mean': float(np.mean([accuracies[c] for c in members]))
          if members else None for name, members in groups.items()}


def _rotated(output_dir: str) -> set[str]:
  """The clients the run rotated (clients_final.csv's `rotated` column,
  written only by a run that rotates some)."""
  with open(os.path.join(output_dir, 'clients_final.csv')) as f:
    return {r['client'] for r in csv.DictReader(f) if r.get('rotated') == '1'}


def _purity(output_dir: str, rotated: set[str]) -> tuple[int, float]:
  """CFL's final clusters (cfl_tree.json) and their purity against the
  rotated clients: the share of the clients whose cluster's majority is of
  their kind (rotated or upright)."""
  with open(os.path.join(output_dir, cfl.TREE_FILE)) as f:
    clusters = [set(n['clients']) for n in json.load(f) if n['cluster']]
  placed = sum(len(c) for c in clusters)
  agreeing = sum(max(len(c & rotated), len(c - rotated)) for c in clusters)
  return len(clusters), agreeing / placed


def _distillation_steps(config) -> dict[str, Optional[float]]:
  """FedDF's distillations (feddf_distillation.csv): the share that
  stopped before --feddf_distillation_steps (patience ran out: a larger
  budget would not have changed them) and the mean step kept."""
  budget = config.settings.feddf_distillation_steps
  with open(os.path.join(config.output_dir, feddf.DISTILLATION_LOG)) as f:
    rows = list(csv.DictReader(f))
  if not rows or not budget:
    return dict(distillation_stopped_early=None, best_step=None)
  return dict(
      distillation_stopped_early=float(np.mean(
          [int(r['steps']) < budget for r in rows])),
      best_step=float(np.mean([int(r['best_step']) for r in rows])))


def _mean_row(runs: list[dict[str, Any]], **labels) -> dict[str, Any]:
  """The mean over seeds of every figure the runs have (None where none
  has it)."""
  keys = [k for k in runs[0] if k != 'seed']

  def mean(key):
    values = [r[key] for r in runs if r[key] is not None]
    return float(np.mean(values)) if values else None

  return {**labels, 'seeds': len(runs), **{k: mean(k) for k in keys}}


def _clustering_rows(seeds: list[int]) -> list[dict[str, Any]]:
  rows = []
  for setting, fraction in ROTATIONS.items():
    for method, (algorithm, kind) in CLUSTERING_METHODS.items():
      runs = []
      for seed in seeds:
        logging.info('clustering, %s, seed %d: %s', setting, seed, method)
        config = _config(algorithm, os.path.join(
            _OUTPUT_DIR.value, 'clustering', setting, f'seed{seed}', method),
            seed, partition='homogeneous', rotated_client_fraction=fraction)
        result = _run(config)
        if result is None:
          continue
        accuracies = _accuracies(result, kind)
        rotated = _rotated(config.output_dir)
        clusters, purity = (_purity(config.output_dir, rotated)
                            if algorithm == 'cfl' else (None, None))
        stats = statistics.summarize(list(accuracies.values()))
        runs.append(dict(
            seed=seed, mean=stats.mean, worst_10_mean=stats.worst_10_mean,
            **_group_means(accuracies, {
                'upright': set(accuracies) - rotated, 'rotated': rotated}),
            clusters=clusters, purity=purity if rotated else None,
            seconds_per_round=run_files.seconds_per_round(
                config.output_dir)))
      if runs:
        rows.append(_mean_row(runs, setting=setting, method=method))
  return rows


def _distillation_rows(seeds: list[int]) -> list[dict[str, Any]]:
  per_method = {method: [] for method in DISTILLATION_METHODS}
  for seed in seeds:
    results = {}
    for method, (algorithm, settings, kind) in DISTILLATION_METHODS.items():
      logging.info('distillation, seed %d: %s', seed, method)
      config = _config(algorithm, os.path.join(
          _OUTPUT_DIR.value, 'distillation', f'seed{seed}', method), seed,
          partition='dirichlet', alpha=0.5, **settings)
      result = _run(config)
      if result is not None:
        results[method] = (_accuracies(result, kind), dict(
            seconds_per_round=run_files.seconds_per_round(config.output_dir),
            **(_distillation_steps(config) if algorithm == 'feddf' else {})))
    two = _config('feddf', os.path.join(_OUTPUT_DIR.value, 'unused'), seed,
                  partition='dirichlet', alpha=0.5, **_TWO, **_SETS)
    assignment = client_architectures.client_assignment(
        two, driver.build_experiment(two).data.client_ids)
    groups = {a: {c for c, arch in assignment.items() if arch == a}
              for a in ARCHITECTURES}
    alone = [results.get(f'standalone_{a}') for a in ARCHITECTURES]
    if all(alone):
      # Each client with the model of its own architecture, trained alone.
      results['standalone'] = ({c: alone[ARCHITECTURES.index(a)][0][c]
                                for c, a in assignment.items()}, {})
    for method, (accuracies, figures) in results.items():
      stats = statistics.summarize(list(accuracies.values()))
      per_method.setdefault(method, []).append(dict(
          seed=seed, mean=stats.mean, worst_10_mean=stats.worst_10_mean,
          **_group_means(accuracies, groups),
          **{key: figures.get(key) for key in (
              'distillation_stopped_early', 'best_step',
              'seconds_per_round')}))
  return [_mean_row(runs, method=method)
          for method, runs in per_method.items() if runs]


def main(argv):
  del argv
  unknown = sorted(set(_PARTS.value) - set(PARTS))
  if unknown:
    raise app.UsageError(f'--parts: unknown {", ".join(unknown)}; choose'
                         f' from {", ".join(PARTS)}.')
  log_filter.keep_info_logs_of_tff_fair_only()
  results = report.Results('cfl_distillation_fmnist', {
      f.name: f.value for f in (_OUTPUT_DIR, _PARTS, _SEEDS, _ROUNDS,
                                _DATA_DIR, run_files.FINISHED_ONLY)})
  seeds = [int(s) for s in _SEEDS.value]
  with local_runtime.local_context():
    if 'clustering' in _PARTS.value:
      rows = _clustering_rows(seeds)
      report.print_rows(_CLUSTERING_COLUMNS, rows)
      results.table(
          'clustering', 'Homogeneous partition, half the clients rotated or'
          ' none; accuracy of the model each client uses',
          _CLUSTERING_COLUMNS, rows)
      results.save(_RESULTS_FILE.value)
    if 'distillation' in _PARTS.value:
      rows = _distillation_rows(seeds)
      report.print_rows(_DISTILLATION_COLUMNS, rows)
      results.table(
          'distillation', 'Dirichlet(0.5), LeNet and FedAvgCNN clients;'
          ' accuracy of the model each client uses', _DISTILLATION_COLUMNS,
          rows)
      results.save(_RESULTS_FILE.value)
  results.write(_RESULTS_FILE.value)


if __name__ == '__main__':
  app.run(main)
