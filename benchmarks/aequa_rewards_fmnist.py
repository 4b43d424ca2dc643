r"""Training-time Aequa against its baselines, a free rider and a noisy client.

Fashion-MNIST, 10 clients (1,000 examples each: 700 train / 100 validation
/ 200 test), partitions quantity skew (kappa 0.5 to 2 clients) and
Dirichlet(0.5), and as in `aequa_fmnist` two server held-out sets of
10,000 examples no client holds (post-training Aequa's curve and
contributions, IAFL's contributions). In each, `client_0001` is a free
rider (every training label random) and `client_0002` has 50% label noise
(`--label_noise_file`). The same rounds, data and seed for every method:

* training-time Aequa (`aequa_rewards`: widths earned by CGSV contributions
  each round; final accuracy: the global model at the width it earned),
  and the same scored against the others' aggregate
  (`aequa_rewards_loo`: `--contribution_assessment=cgsv_leave_one_out`);
* post-training Aequa (`aequa`: allocation after training);
* CGSV and IAFL (each client's own, rewarded model);
* FedAvg + fine-tuning (each client's fine-tuned model).

Per partition: the Pearson correlation between each client's final
accuracy and its standalone accuracy (its model trained alone, from the
post-training Aequa run), the mean final accuracy, the free rider's and the
noisy client's final accuracy. Each on two test sets: the common test set
(the server's held-out test set; `--common_test_evaluation`), as IAFL's
code, which the Aequa paper follows for this metric, measures both
accuracies; and each client's own test split, where a client with few
classes scores high alone and a fine-tuned model follows it. Then,
for training-time Aequa the free rider's width per round, the honest
clients (neither the free rider nor the noisy one) that end at p_min, the
bytes each client received and sent in the last round, and the median
seconds of a round (rounds 2..N) against FedAvg's (the fedavg_ft run's
rounds).

Targets (issue "Aequa's training-time rewards..."): training-time Aequa has
the highest correlation of the five in both partitions; the free rider is
at p_min by round 10 and stays there; a training-time Aequa round costs at
most 1.6x a FedAvg round.

Finished runs are read back, not re-run; an interrupted run resumes, and
a finished one without the common-test kinds is re-evaluated only.

  .venv/bin/python -m benchmarks.aequa_rewards_fmnist \
      --output_dir=runs/bench_aequa_rewards

With `--results_file` it also writes the results as JSON
(`benchmarks/report.py`): tables `common` and `own` (a row per partition
and method: pearson, mean_accuracy, free_rider_accuracy, noisy_accuracy on
that test set) and `training_time` (a row per partition and training-time
variant: free_rider_at_p_min_from_round, 0 for never;
honest_clients_at_p_min; last_round_bytes_free_rider and _max;
seconds_per_round, fedavg_seconds_per_round and over_fedavg).
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import csv
import json
import os

from absl import app
from absl import flags
import numpy as np

from benchmarks import report
from tff_fair.fairness import metrics as fairness_metrics
from tff_fair.runtime import local as local_runtime
from tff_fair.training import driver
from tff_fair.training import log_filter
from tff_fair.training import run_context
from tff_fair.training.recipes import registry

_OUTPUT_DIR = flags.DEFINE_string('output_dir', 'runs/bench_aequa_rewards',
                                  'Runs and the result table go here.')
_ROUNDS = flags.DEFINE_integer('rounds', 20, 'Federated rounds.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of every run.')
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See the README.')
_GAMMA = flags.DEFINE_float(
    'contribution_gamma', 0.9, "Training-time Aequa's weight of past"
    ' contributions (use another --output_dir for another value).')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Also write the results as JSON here (schema:'
    ' benchmarks/report.py).')

FREE_RIDER = 'client_0001'
NOISY_CLIENT = 'client_0002'
_LABEL_NOISE = {FREE_RIDER: 1.0, NOISY_CLIENT: 0.5}
P_MIN = 0.1
COMMON_TEST = run_context.COMMON_TEST

_PARTITIONS = {
    'quantity_skew': dict(partition='quantity_skew', kappa=0.5,
                          quantity_clients=2),
    'dirichlet_0.5': dict(partition='dirichlet', alpha=0.5),
}
# Method -> (algorithm, its settings, the evaluation holding each client's
# final model's accuracy).
_METHODS = {
    'aequa_rewards': ('aequa_rewards', dict(p_min=P_MIN), 'aequa_rewards'),
    'aequa_rewards_loo': ('aequa_rewards', dict(
        p_min=P_MIN, contribution_assessment='cgsv_leave_one_out'),
                          'aequa_rewards'),
    'aequa': ('aequa', dict(p_min=P_MIN), 'aequa'),
    'cgsv': ('cgsv', {}, 'personalized'),
    'iafl': ('iafl', {}, 'personalized'),
    'fedavg_ft': ('fedavg_ft', {}, 'fine_tuned'),
}


_ACCURACY_COLUMNS = (
    report.Column('partition', 'partition'),
    report.Column('method', 'method'),
    report.Column('pearson', 'Pearson', '.4f'),
    report.Column('mean_accuracy', 'mean acc.', '.4f'),
    report.Column('free_rider_accuracy', 'free rider', '.4f'),
    report.Column('noisy_accuracy', 'noisy client', '.4f'))
_TRAINING_TIME_COLUMNS = (
    report.Column('partition', 'partition'),
    report.Column('method', 'method'),
    report.Column('free_rider_at_p_min_from_round',
                  'free rider at p_min from round', 'd'),
    report.Column('honest_clients_at_p_min', 'honest clients at p_min', 'd'),
    report.Column('last_round_bytes_free_rider',
                  'free rider bytes, last round', ',d'),
    report.Column('last_round_bytes_max', 'most bytes, last round', ',d'),
    report.Column('seconds_per_round', 's/round', '.2f'),
    report.Column('fedavg_seconds_per_round', 'FedAvg s/round', '.2f'),
    report.Column('over_fedavg', 'ratio', '.2f'))


# Test sets each final model is measured on -> suffix of its model kind.
_TEST_SETS = {'common': COMMON_TEST, 'own': ''}
_TEST_SET_NAMES = {
    'common': "the server's 10,000 held-out test examples, the paper's",
    'own': "each client's own 200 test examples"}

# The training-time Aequa variants: widths, bytes and seconds are reported.
_TRAINING_TIME = tuple(m for m, (algorithm, _, _) in _METHODS.items()
                       if algorithm == 'aequa_rewards')


def _run_dir(partition: str, method: str) -> str:
  return os.path.join(_OUTPUT_DIR.value, partition, method)


def _final_accuracies(partition: str, method: str, partition_settings,
                      noise_file: str) -> dict[str, dict[str, float]]:
  """Kind -> client -> accuracy of a run; runs it unless it is finished."""
  run_dir = _run_dir(partition, method)
  table = os.path.join(run_dir, 'clients_final.csv')
  if not os.path.exists(table) or not any(
      kind.endswith(COMMON_TEST) for kind in _read(table)):
    algorithm, settings, _ = _METHODS[method]
    if algorithm == 'aequa_rewards':
      settings = dict(settings, contribution_gamma=_GAMMA.value)
    driver.run(registry.make_config(
        algorithm=algorithm, dataset='fashion_mnist', num_clients=10,
        clients_per_round=10, examples_per_client=1000,
        validation_fraction=0.1, test_fraction=0.2, rounds=_ROUNDS.value,
        common_test_evaluation=True, local_epochs=1, batch_size=32,
        client_learning_rate=0.05,
        eval_every=0, seed=_SEED.value, data_dir=_DATA_DIR.value,
        server_held_out_examples=10_000,
        label_noise_file=noise_file, output_dir=run_dir,
        **partition_settings, **settings))
  return _read(table)


def _read(table: str) -> dict[str, dict[str, float]]:
  """clients_final.csv as kind -> client -> accuracy."""
  accuracies = {}
  with open(table) as f:
    for row in csv.DictReader(f):
      accuracies.setdefault(row['model'], {})[row['client']] = float(
          row['accuracy'])
  return accuracies


def _median_round_seconds(run_dir: str) -> float:
  """Median seconds of rounds 2..N (round 1 traces the computations)."""
  with open(os.path.join(run_dir, 'metrics.csv')) as f:
    seconds = [float(r['seconds']) for r in csv.DictReader(f)
               if int(r['round']) >= 2]
  return float(np.median(seconds))


def _rounds_log(run_dir: str) -> list[dict[str, str]]:
  with open(os.path.join(run_dir, 'aequa_rewards_rounds.csv')) as f:
    return list(csv.DictReader(f))


def _training_time_rewards(partition: str, method: str,
                           fedavg_seconds: float,
                           accuracies: dict[str, dict[str, float]],
                           lines: list[str]) -> dict[str, float]:
  """A training-time Aequa run's widths, bytes and seconds; adds lines.

  Also per client: its standalone and final accuracy (`accuracies`: name ->
  client -> accuracy, on each test set), the width it ended with and its
  assessment (cosine) averaged over the rounds; and the free rider's
  assessment each round.
  """
  run_dir = _run_dir(partition, method)
  log = _rounds_log(run_dir)
  rider = [float(r['next_width']) for r in log if r['client'] == FREE_RIDER]
  assessments = {}
  for r in log:
    assessments.setdefault(r['client'], []).append(float(r['assessment']))
  at_floor = [w <= P_MIN + 1e-6 for w in rider]
  from_round = next(
      (i + 1 for i in range(len(at_floor)) if all(at_floor[i:])), 0)
  last = [r for r in log if int(r['round']) == _ROUNDS.value]
  traffic = {r['client']: int(r['bytes_received']) + int(r['bytes_sent'])
             for r in last}
  end_width = {r['client']: float(r['next_width']) for r in last}
  honest_at_floor = sorted(
      cid for cid, w in end_width.items()
      if cid not in _LABEL_NOISE and w <= P_MIN + 1e-6)
  seconds = _median_round_seconds(run_dir)
  lines.append(f'{method}: free rider width after each round: ' + ' '.join(
      f'{w:.2f}' for w in rider))
  lines.append(f'{method}: free rider assessment each round: ' + ' '.join(
      f'{a:.2f}' for a in assessments[FREE_RIDER]))
  lines.append(f'{method}: client ({", ".join(accuracies)}, final width,'
               ' mean assessment):')
  lines.extend(
      f'  {cid} ' + ' '.join(f'{a[cid]:.3f}' for a in accuracies.values())
      + f' {end_width[cid]:.2f} {np.mean(assessments[cid]):+.3f}'
      for cid in sorted(end_width))
  lines.append(f'{method}: free rider at p_min from round:'
               f' {from_round or "never"}; honest clients at p_min at the'
               f' end: {len(honest_at_floor)} {honest_at_floor}')
  lines.append(
      f'{method}: last round bytes (received + sent) per client: free rider'
      f' {traffic[FREE_RIDER]:,}, min {min(traffic.values()):,},'
      f' max {max(traffic.values()):,}')
  lines.append(
      f'{method}: seconds per round (median of rounds 2..{_ROUNDS.value}):'
      f' {seconds:.2f}, fedavg {fedavg_seconds:.2f}, ratio'
      f' {seconds / fedavg_seconds:.2f}')
  return {
      f'{method}_free_rider_at_p_min_from_round': from_round,
      f'{method}_honest_clients_at_p_min': len(honest_at_floor),
      f'{method}_last_round_bytes_free_rider': traffic[FREE_RIDER],
      f'{method}_last_round_bytes_max': max(traffic.values()),
      f'{method}_last_round_bytes_min': min(traffic.values()),
      f'{method}_seconds_per_round': seconds,
      f'{method}_over_fedavg': seconds / fedavg_seconds,
  }


def main(argv):
  del argv
  log_filter.keep_info_logs_of_tff_fair_only()
  results = report.Results('aequa_rewards_fmnist', {
      f.name: f.value for f in (_OUTPUT_DIR, _ROUNDS, _SEED, _DATA_DIR,
                                _GAMMA)})
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  noise_file = os.path.join(_OUTPUT_DIR.value, 'label_noise.json')
  with open(noise_file, 'w') as f:
    json.dump(_LABEL_NOISE, f)
  rows, lines = [], []
  with local_runtime.local_context():
    for partition, settings in _PARTITIONS.items():
      finals = {m: _final_accuracies(partition, m, settings, noise_file)
                for m in _METHODS}
      clients = sorted(finals['aequa']['standalone'])
      row = {'partition': partition}
      # Test set -> method -> client -> accuracy; 'standalone' too.
      by_test_set = {
          test_set: {
              'standalone': finals['aequa']['standalone' + suffix],
              **{m: finals[m][kind + suffix]
                 for m, (_, _, kind) in _METHODS.items()}}
          for test_set, suffix in _TEST_SETS.items()}
      for test_set, accuracies in by_test_set.items():
        for method in _METHODS:
          final = accuracies[method]
          row[f'{method}_pearson_{test_set}'] = (
              fairness_metrics.pearson_correlation(
                  np.array([final[c] for c in clients]),
                  np.array([accuracies['standalone'][c] for c in clients])))
          row[f'{method}_mean_accuracy_{test_set}'] = float(np.mean(
              [final[c] for c in clients]))
          row[f'{method}_free_rider_accuracy_{test_set}'] = final[FREE_RIDER]
          row[f'{method}_noisy_accuracy_{test_set}'] = final[NOISY_CLIENT]
      lines.append(f'\n== {partition}: free rider {FREE_RIDER} (random'
                   f' labels), {NOISY_CLIENT} 50% label noise ==')
      for test_set in _TEST_SETS:
        lines.append(f'-- accuracies on the {test_set} test set'
                     f' ({_TEST_SET_NAMES[test_set]}) --')
        lines.append('{:<18}{:>9}{:>11}{:>12}{:>9}'.format(
            'method', 'pearson', 'mean acc', 'free rider', 'noisy'))
        for method in _METHODS:
          lines.append('{:<18}{:>9.4f}{:>11.4f}{:>12.4f}{:>9.4f}'.format(
              method, *(row[f'{method}_{name}_{test_set}'] for name in (
                  'pearson', 'mean_accuracy', 'free_rider_accuracy',
                  'noisy_accuracy'))))
      fedavg_seconds = _median_round_seconds(_run_dir(partition, 'fedavg_ft'))
      row['fedavg_seconds_per_round'] = fedavg_seconds
      for method in _TRAINING_TIME:
        row.update(_training_time_rewards(
            partition, method, fedavg_seconds, {
                f'{name} acc ({test_set})': by_test_set[test_set][source]
                for test_set in _TEST_SETS
                for name, source in (('standalone', 'standalone'),
                                     ('final', method))}, lines))
      rows.append(row)
  print('\n'.join(lines), flush=True)
  with open(os.path.join(_OUTPUT_DIR.value, 'aequa_rewards_fmnist.csv'), 'w',
            newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  for test_set in _TEST_SETS:
    results.table(
        test_set, f'Accuracies on the {test_set} test set'
        f' ({_TEST_SET_NAMES[test_set]})',
        _ACCURACY_COLUMNS,
        [{'partition': row['partition'], 'method': method,
          **{name: row[f'{method}_{name}_{test_set}'] for name in (
              'pearson', 'mean_accuracy', 'free_rider_accuracy',
              'noisy_accuracy')}}
         for row in rows for method in _METHODS])
  results.table(
      'training_time', 'Training-time Aequa: widths, bytes and seconds',
      _TRAINING_TIME_COLUMNS,
      [{'partition': row['partition'], 'method': method,
        'fedavg_seconds_per_round': row['fedavg_seconds_per_round'],
        **{c.key: row[f'{method}_{c.key}']
           for c in _TRAINING_TIME_COLUMNS[2:] if f'{method}_{c.key}' in row}}
       for row in rows for method in _TRAINING_TIME])
  results.write(_RESULTS_FILE.value)


if __name__ == '__main__':
  app.run(main)
