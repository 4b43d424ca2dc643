r"""Ditto vs FedAvg, FedAvg + fine-tuning and standalone on Fashion-MNIST.

One run, one seed. Fashion-MNIST, label skew #C=2, 20 clients with 300
training and 100 test examples each, 50 rounds, every client every round.
Ditto runs with lambda 0.1, lambda 1, and with each client's lambda chosen
from {0.01, 0.1, 1, 2} by validation loss every round (that run's clients
hold 40 validation examples more).
Prints a table and writes it as CSV; then the same with half the clients
malicious under A1 (label poisoning): benign clients' mean accuracy. Every
run trains with the Ditto reference's Fashion-MNIST settings (client SGD,
lr 0.05, batch 16, one epoch per round; the personal model the same); every
federated run's server uses momentum 0.9 (FedAvgM; `--server_optimizer=sgd`
for plain FedAvg), so Ditto's anchor is as good as FedAvg makes it.

  .venv/bin/python -m benchmarks.ditto_fmnist --output_dir=runs/bench_ditto

With `--results_file` it also writes both tables as JSON
(`benchmarks/report.py`): `clean` and `a1`, a row per method with keys
method, model, mean, worst_10_mean, variance (accuracy over the benign
clients' own test splits) and seconds_per_round (mean of rounds 2..N).

Each configuration runs through `tff_fair.training.driver`, so a killed
benchmark resumes where it stopped when run again with the same flags.
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import csv
import os

from absl import app
from absl import flags
from absl import logging
import numpy as np

from benchmarks import report
from tff_fair.runtime import local as local_runtime
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training import log_filter
from tff_fair.training.recipes import registry

_OUTPUT_DIR = flags.DEFINE_string('output_dir', 'runs/bench_ditto',
                                  'Runs and the result table go here.')
_ROUNDS = flags.DEFINE_integer('rounds', 50, 'Federated rounds.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of every run.')
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See the README.')
_BATCH_SIZE = flags.DEFINE_integer(
    'batch_size', 16, 'Client batch size of every run (the reference\'s 16).')
_SERVER_OPTIMIZER = flags.DEFINE_enum(
    'server_optimizer', 'sgdm', config_lib.OPTIMIZERS,
    'Server optimizer of every federated run (sgdm: momentum 0.9, FedAvgM).')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Also write the results as JSON here (schema:'
    ' benchmarks/report.py).')

_LAMBDA_GRID = '0.01,0.1,1,2'
_COLUMNS = ('method', 'model', 'mean', 'worst_10_mean', 'variance',
            'seconds_per_round')
_RESULT_COLUMNS = (
    report.Column('method', 'method'), report.Column('model', 'model'),
    report.Column('mean', 'mean acc.', '.4f'),
    report.Column('worst_10_mean', 'worst-10%', '.4f'),
    report.Column('variance', 'variance', '.4f'),
    report.Column('seconds_per_round', 's/round', '.2f'))


def _config(name: str, **overrides) -> config_lib.RunConfig:
  values = dict(
      dataset='fashion_mnist', partition='label_skew', classes_per_client=2,
      num_clients=20, clients_per_round=20, examples_per_client=400,
      validation_fraction=0.0, test_fraction=0.25, rounds=_ROUNDS.value,
      local_epochs=1, batch_size=_BATCH_SIZE.value, client_learning_rate=0.05,
      server_optimizer=_SERVER_OPTIMIZER.value, server_learning_rate=1.0,
      eval_every=0,
      seed=_SEED.value, data_dir=_DATA_DIR.value,
      output_dir=os.path.join(_OUTPUT_DIR.value, name))
  values.update(overrides)
  if values.get('algorithm') == 'standalone':
    # No rounds, no server: a run refuses the settings it would ignore.
    for name in ('server_optimizer', 'server_learning_rate', 'eval_every'):
      del values[name]
  return registry.make_config(**values)


def _seconds_per_round(run_name):
  """Round times after round 1 (which pays for tracing), from the run's
  metrics.csv, so a benchmark resumed after its runs finished still has
  them."""
  path = os.path.join(_OUTPUT_DIR.value, run_name, 'metrics.csv')
  if not os.path.exists(path):  # Standalone training has no rounds.
    return []
  with open(path) as f:
    return [float(r['seconds']) for r in csv.DictReader(f)
            if int(r['round']) > 1]


def _row(method, kind, result, run_name):
  """Statistics of one model kind over the run's benign clients."""
  metrics = result.evaluations[kind]
  accuracies = np.array([m.accuracy for cid, m in metrics.items()
                         if cid not in result.malicious])
  seconds = _seconds_per_round(run_name)
  k = max(1, int(np.ceil(0.1 * accuracies.size - 1e-9)))
  return dict(method=method, model=kind, mean=accuracies.mean(),
              worst_10_mean=np.sort(accuracies)[:k].mean(),
              variance=accuracies.var(),
              seconds_per_round=np.mean(seconds) if seconds else np.nan)


def _print_and_save(rows, name):
  lines = ['{:<36}{:<14}{:>8}{:>10}{:>10}{:>10}'.format(
      'method', 'model', 'mean', 'worst10%', 'variance', 's/round')]
  for r in rows:
    lines.append('{:<36}{:<14}{:>8.4f}{:>10.4f}{:>10.4f}{:>10.2f}'.format(
        r['method'], r['model'], r['mean'], r['worst_10_mean'],
        r['variance'], r['seconds_per_round']))
  print('\n'.join(lines), flush=True)
  path = os.path.join(_OUTPUT_DIR.value, name)
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  logging.info('Wrote %s', path)


def main(argv):
  del argv
  log_filter.keep_info_logs_of_tff_fair_only()
  results = report.Results('ditto_fmnist', {
      f.name: f.value for f in (_OUTPUT_DIR, _ROUNDS, _SEED, _DATA_DIR,
                                _BATCH_SIZE, _SERVER_OPTIMIZER)})
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  with local_runtime.local_context():
    rows = []
    for lam in (0.1, 1.0):
      name = f'ditto_lambda{lam}'
      result = driver.run(_config(name, algorithm='ditto', ditto_lambda=lam))
      rows.append(_row(f'ditto lambda={lam}', 'personalized', result, name))
    # Lambda chosen per client by validation loss from a grid and re-chosen
    # every round (the reference's dynamic lambda). The 40 validation
    # examples per client are extra, so train and test stay 300 and 100.
    result = driver.run(_config(
        'ditto_lambda_grid', algorithm='ditto',
        ditto_lambda_grid=_LAMBDA_GRID, examples_per_client=440,
        validation_fraction=40 / 440, test_fraction=100 / 440))
    rows.append(_row(f'ditto lambda from {{{_LAMBDA_GRID}}}', 'personalized',
                     result, 'ditto_lambda_grid'))
    fedavg = driver.run(_config('fedavg_ft', algorithm='fedavg_ft'))
    rows.append(_row('fedavg', 'global', fedavg, 'fedavg_ft'))
    rows.append(_row('fedavg + fine-tuning', 'fine_tuned', fedavg,
                     'fedavg_ft'))
    standalone = driver.run(_config('standalone', algorithm='standalone'))
    rows.append(_row('standalone', 'standalone', standalone, 'standalone'))
    _print_and_save(rows, 'ditto_fmnist.csv')
    results.table('clean', 'Every client honest', _RESULT_COLUMNS, rows)

    attack = dict(attack='label_poisoning', malicious_fraction=0.5)
    attacked = []
    for lam, name in ((0.1, 'a1_ditto_lambda0.1'), (1.0, 'a1_ditto')):
      result = driver.run(_config(name, algorithm='ditto', ditto_lambda=lam,
                                  **attack))
      attacked.append(_row(f'A1 50%: ditto lambda={lam}', 'personalized',
                           result, name))
    result = driver.run(_config('a1_fedavg', algorithm='fedavg', **attack))
    attacked.append(_row('A1 50%: fedavg', 'global', result, 'a1_fedavg'))
    print('\nBenign clients only, half the clients poisoning labels (A1):')
    _print_and_save(attacked, 'ditto_fmnist_a1.csv')
    results.table('a1', 'Half the clients poisoning labels (A1): benign'
                  ' clients only', _RESULT_COLUMNS, attacked)
  results.write(_RESULTS_FILE.value)


if __name__ == '__main__':
  app.run(main)
