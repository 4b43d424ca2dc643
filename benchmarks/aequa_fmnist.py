r"""Aequa vs FedAvg (+ fine-tuning) on Fashion-MNIST under four partitions.

One run prints a table and writes it as CSV. Fashion-MNIST, 10 clients
(1,000 examples each: 700 train / 100 validation / 200 test), partitions
homogeneous, Dirichlet(0.5), quantity skew (kappa 0.5 to 2 clients) and
label skew #C=3, the same rounds for every method.

Widths run from 0.1 to 1.0 in steps of 0.01 (91 levels). At p_min 0.25 the
narrowest LeNet still reached 0.65-0.70 under Dirichlet(0.5): more than
the weakest client (0.39 alone) should get for a gain equal to the
others'. Its reward was clipped there, and Pearson fell to 0.952
(`--p_min=0.25`).

The server holds out two sets of 10,000 examples no client holds
(`--server_held_out_examples`, class shares of the whole data set) in the
role of a common test set. With the clients' pooled splits (1,000
validation, 2,000 test examples) the curve's noise, not the clients,
decided the homogeneous allocation (Pearson 0.946 with `--p_min=0.25
--server_held_out_examples=0`).

Per partition:

* full-width global accuracy (mean over clients' test splits) of Aequa and of
  FedAvg;
* Pearson correlation between each client's final accuracy and its
  contribution (its standalone model's accuracy on the server's validation
  set, where the width-accuracy curve is measured too), and the
  collaboration gain spread (max gain - min gain): for Aequa the global
  model at the allocated width against the standalone model, both on the
  server's test set (the run's aequa_fairness.json, with its IR
  violations); for FedAvg + fine-tuning each client's fine-tuned model on
  its own test split.

Then the slimmable step-time ratio (CIFAR CNN, batch 64, width 0.25 vs 1.0;
one client on every core, four clients at once as in a round, and one
client on one TensorFlow thread) and the allocator time for 10,000 clients
and 76 width levels, from their own scripts.

  .venv/bin/python -m benchmarks.aequa_fmnist --output_dir=runs/bench_aequa

With `--results_file` it also writes the partition table as JSON
(`benchmarks/report.py`): table `partitions`, a row per partition with the
keys of aequa_fmnist.csv. The timings' scripts write their own with their
own `--results_file`.
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import csv
import json
import os
import subprocess
import sys

from absl import app
from absl import flags
import numpy as np

from benchmarks import report
from tff_fair.fairness import metrics as fairness_metrics
from tff_fair.runtime import local as local_runtime
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training import log_filter
from tff_fair.training.recipes import registry

_OUTPUT_DIR = flags.DEFINE_string('output_dir', 'runs/bench_aequa',
                                  'Runs and the result table go here.')
_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Federated rounds.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of every run.')
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See the README.')
_P_MIN = flags.DEFINE_float('p_min', 0.1, 'Narrowest width, trained and'
                            ' allocated (the curve steps by 0.01 from it).')
_SERVER_HELD_OUT = flags.DEFINE_integer(
    'server_held_out_examples', 10_000,
    'Size of each server held-out set (0: the clients\' pooled splits).')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Also write the results as JSON here (schema:'
    ' benchmarks/report.py).')

_RESULT_COLUMNS = (
    report.Column('partition', 'partition'),
    report.Column('aequa_full_width_accuracy', 'Aequa full width', '.4f'),
    report.Column('fedavg_accuracy', 'FedAvg', '.4f'),
    report.Column('aequa_pearson', 'Aequa Pearson', '.4f'),
    report.Column('fedavg_ft_pearson', 'FedAvg-FT Pearson', '.4f'),
    report.Column('aequa_gain_spread', 'Aequa gain spread', '.4f'),
    report.Column('fedavg_ft_gain_spread', 'FedAvg-FT gain spread', '.4f'),
    report.Column('aequa_ir_violations', 'IR violations', 'd'))

_PARTITIONS = {
    'homogeneous': dict(partition='homogeneous'),
    'dirichlet_0.5': dict(partition='dirichlet', alpha=0.5),
    'quantity_skew': dict(partition='quantity_skew', kappa=0.5,
                          quantity_clients=2),
    'label_skew_3': dict(partition='label_skew', classes_per_client=3),
}


def _config(name: str, **overrides) -> config_lib.RunConfig:
  values = dict(
      dataset='fashion_mnist', num_clients=10, clients_per_round=10,
      examples_per_client=1000, validation_fraction=0.1, test_fraction=0.2,
      rounds=_ROUNDS.value, local_epochs=1, batch_size=32,
      client_learning_rate=0.05, eval_every=0, seed=_SEED.value,
      server_held_out_examples=_SERVER_HELD_OUT.value,
      data_dir=_DATA_DIR.value,
      output_dir=os.path.join(_OUTPUT_DIR.value, name))
  values.update(overrides)
  if values['algorithm'] == 'fedavg_ft':
    # It measures nothing on the server's held-out sets, and a run refuses
    # what it would ignore; they are drawn from the examples no client
    # holds, so its clients' data stay Aequa's.
    del values['server_held_out_examples']
  return registry.make_config(**values)


def _mean_accuracy(metrics) -> float:
  return float(np.mean([m.accuracy for m in metrics.values()]))


def _fairness(contributions, metrics):
  clients = sorted(contributions)
  return fairness_metrics.fairness_report(
      [contributions[c] for c in clients],
      [metrics[c].accuracy for c in clients])


def main(argv):
  del argv
  log_filter.keep_info_logs_of_tff_fair_only()
  results = report.Results('aequa_fmnist', {
      f.name: f.value for f in (_OUTPUT_DIR, _ROUNDS, _SEED, _DATA_DIR,
                                _P_MIN, _SERVER_HELD_OUT)})
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  rows = []
  with local_runtime.local_context():
    for name, partition in _PARTITIONS.items():
      aequa = driver.run(_config(f'{name}/aequa', algorithm='aequa',
                                 p_min=_P_MIN.value, width_step=0.01,
                                 **partition))
      fedavg = driver.run(_config(f'{name}/fedavg_ft',
                                  algorithm='fedavg_ft', **partition))
      run_dir = os.path.join(_OUTPUT_DIR.value, name, 'aequa')
      with open(os.path.join(run_dir, 'aequa_allocation.csv')) as f:
        contributions = {r['client']: float(r['contribution'])
                         for r in csv.DictReader(f)}
      with open(os.path.join(run_dir, 'aequa_fairness.json')) as f:
        aequa_fair = fairness_metrics.FairnessReport(**{
            k: v for k, v in json.load(f).items()
            if k in fairness_metrics.FairnessReport.__dataclass_fields__})
      # Fine-tuned models stay with their clients: measured on own tests.
      ft_fair = _fairness(contributions, fedavg.evaluations['fine_tuned'])
      rows.append(dict(
          partition=name,
          aequa_full_width_accuracy=_mean_accuracy(
              aequa.evaluations['global']),
          fedavg_accuracy=_mean_accuracy(fedavg.evaluations['global']),
          aequa_pearson=aequa_fair.pearson,
          fedavg_ft_pearson=ft_fair.pearson,
          aequa_gain_spread=aequa_fair.gain_spread,
          fedavg_ft_gain_spread=ft_fair.gain_spread,
          aequa_ir_violations=aequa_fair.ir_violations))
  header = ('{:<16}{:>11}{:>10}{:>10}{:>10}{:>12}{:>12}{:>6}'.format(
      'partition', 'aequa acc', 'fedavg', 'aequa r', 'ft r',
      'aequa sprd', 'ft sprd', 'IR'))
  lines = [header]
  for r in rows:
    lines.append('{:<16}{:>11.4f}{:>10.4f}{:>10.4f}{:>10.4f}{:>12.4f}'
                 '{:>12.4f}{:>6d}'.format(
                     r['partition'], r['aequa_full_width_accuracy'],
                     r['fedavg_accuracy'], r['aequa_pearson'],
                     r['fedavg_ft_pearson'], r['aequa_gain_spread'],
                     r['fedavg_ft_gain_spread'], r['aequa_ir_violations']))
  print('\n'.join(lines), flush=True)
  with open(os.path.join(_OUTPUT_DIR.value, 'aequa_fmnist.csv'), 'w',
            newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  results.table('partitions', 'Aequa against FedAvg and FedAvg +'
                ' fine-tuning, per partition', _RESULT_COLUMNS, rows)
  results.write(_RESULTS_FILE.value)
  # Timings from their own scripts (separate processes, no TFF worker).
  for command in (('benchmarks.slimmable_step_time',),
                  ('benchmarks.slimmable_step_time', '--concurrent_clients=4'),
                  ('benchmarks.slimmable_step_time', '--threads=1'),
                  ('benchmarks.allocation_timing',)):
    print(f'\n$ python -m {" ".join(command)}', flush=True)
    subprocess.run([sys.executable, '-m', *command], check=True)


if __name__ == '__main__':
  app.run(main)
