r"""The Aequa paper's comparison on every data set available offline here.

Cases: data set x partition, each a seed. Data sets: MNIST (its 10,000 test
images), Fashion-MNIST, CIFAR-10 and SST-2, and SVHN and CIFAR-100 when
TFDS has them prepared on this machine (`tfds_data_dir`; skipped by name
otherwise). Partitions (the paper's, after IAFL's code): homogeneous,
Dirichlet(0.1), quantity skew (kappa 0.5 to 2 clients) and label skew
#C=3 (NIID-Bench's rule; a case a data set cannot form, such as #C=3 on
SST-2's two classes, is skipped by name). Seeds 0, 1, 2 for MNIST and
Fashion-MNIST, 0 for the others (`--seeds` overrides).

Scale (smaller than the paper's, to fit a 2-core machine): 10 clients, all
every round, on a stratified subset of each data set (`SOURCE_EXAMPLES`:
6,000 examples, so about 420 training / 60 validation / 120 test examples
a client, and 12,000 for the CIFAR data sets; the quantity skew keeps its
proportions; `--source_examples` sets one size for all), each data set's
default architecture and rates, one local epoch, and each data set's
round budget (`ROUNDS`: 20 for MNIST, 60 for Fashion-MNIST, the CIFAR
data sets and SST-2; `--rounds` sets one budget for all); SST-2's
records name its client learning rate (`DATASET_SETTINGS`), and SST-2
under Dirichlet(0.1) runs every method with Adam as the server's
optimizer (`CASE_SETTINGS`: with SGD every model predicted one class).
The paper trains more clients for more rounds; the comparison (six
methods on the same clients, data and seed) is the same.

Methods, each its run: post-training Aequa (`aequa`), training-time Aequa
(`aequa_rewards`), FedAvg + fine-tuning (`fedavg_ft`), CGSV, IAFL and
standalone training (each client alone, from the Aequa run's
contributions; IAFL is given the contributions the Aequa run measured,
the same standalone models trained once). Per case:

* global accuracy and balanced accuracy on the common test set (the
  clients' test splits pooled): FedAvg-FT's global model, Aequa's at full
  width, training-time Aequa's at full width, CGSV's and IAFL's server
  models;
* the Pearson correlation between each client's reward accuracy and its
  standalone accuracy, both on the common test set (IAFL's protocol, the
  paper's), with the spread (max - min) of the standalone accuracies
  beside it: where they are nearly equal, Pearson is ill-conditioned;
* Aequa's IR violations and collaboration gain spread (aequa_fairness.json:
  each reward against the client's standalone model on the common test
  set, the allocation made with 95% IR margins, `--ir_confidence`).

Every case is its own resumable directory under `--output_dir`
(`<case>/seed<s>/<training settings>`, e.g.
`rounds=20-source_examples=6000`); an interrupted case resumes, and its
methods that finished are read back, not evaluated again. A finished
case leaves its figures and wall time (over its methods, each the
invocation that finished it) as a record,
`<records_dir>/<case>/seed<s>.json` (benchmarks/run_records.py),
and is read back from it, never trained again, so the table is built in
parts (`--cases=mnist:dirichlet,fashion_mnist:label_skew`) across sessions
whose run directories do not survive: commit the records with the results.
`--results_file` gathers every recorded case (mean and spread over seeds)
into one results file (benchmarks/report.py's schema); with
`--finished_only` nothing trains, and the cases asked for that have no
record yet are named in the log and left out.

  .venv/bin/python -m benchmarks.aequa_table --output_dir=runs/aequa_table \
      --records_dir=benchmarks/results/aequa_table \
      --results_file=benchmarks/results/aequa_table.json
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import csv
import itertools
import json
import os
from typing import Any, Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np

from benchmarks import report
from benchmarks import run_files
from benchmarks import run_records
from tff_fair import data as data_lib
from tff_fair import errors
from tff_fair.fairness import metrics as fairness_metrics
from tff_fair.runtime import local as local_runtime
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training import log_filter
from tff_fair.training import rewards as rewards_lib
from tff_fair.training import run_context
from tff_fair.training.recipes import registry

DATASETS = ('mnist', 'fashion_mnist', 'cifar10', 'sst2')
# Through TFDS, when prepared on the machine.
TFDS_DATASETS = ('svhn', 'cifar100')
PARTITIONS = {
    'homogeneous': dict(partition='homogeneous'),
    'dirichlet': dict(partition='dirichlet', alpha=0.1),
    'quantity_skew': dict(partition='quantity_skew', kappa=0.5,
                          quantity_clients=2),
    'label_skew': dict(partition='label_skew', classes_per_client=3,
                       label_skew_rule='niid_bench'),
}
# Method -> (algorithm, its settings, the kind of each client's reward,
# the kind of the global model or None).
# Aequa's IR rule (its recipe's default). A record made under another rule
# is not read back: the case's Aequa run re-rewards (no retraining when its
# run directory survives) and the case is recorded again.
AEQUA_IR_CONFIDENCE = 0.95
METHODS = {
    'aequa': ('aequa', {'ir_confidence': AEQUA_IR_CONFIDENCE}, 'aequa',
              'global'),
    'aequa_rewards': ('aequa_rewards', {}, 'aequa_rewards', 'global'),
    'fedavg_ft': ('fedavg_ft', {}, 'fine_tuned', 'global'),
    'cgsv': ('cgsv', {}, 'personalized', 'global'),
    'iafl': ('iafl', {}, 'personalized', 'global'),
}
# Methods whose contributions are Aequa's standalone accuracies: each
# client's model trained alone from the same initial weights for the same
# epochs, scored on the same common held-out set. They are given the ones
# the case's Aequa run (run before them) measured, the values they would
# measure (bit for bit), without training every client alone twice.
CONTRIBUTIONS_FROM_AEQUA = ('iafl',)
COMMON_TEST = run_context.COMMON_TEST
# Federated rounds (and standalone epochs) per data set. CIFAR's CNN and
# SST-2's text CNN learn slower than the digits' models: after 20 rounds
# CIFAR-10's global models were near chance under Dirichlet(0.1) and
# SST-2's below the clients' standalone models even when homogeneous.
# Fashion-MNIST's 20-round global model was within the IR margin of the
# best clients' standalone models, which then cannot be rewarded above
# them (docs/benchmarks.md, the 20-round records).
ROUNDS = {'fashion_mnist': 60, 'cifar10': 60, 'cifar100': 60, 'sst2': 60}
_DEFAULT_ROUNDS = 20
# Examples per data set (a stratified subset). CIFAR's CNN needs more
# examples a client than the others: with 6,000 (about 420 training
# examples a client) CIFAR-10's Aequa full width was 4.3 points below
# FedAvg's under Dirichlet(0.1) at 60 rounds, and a longer budget instead
# overfit the other partitions; at 12,000 the quantity skew's gap is the
# one that misses (2.2 points; docs/benchmarks.md).
SOURCE_EXAMPLES = {'cifar10': 12000, 'cifar100': 12000}
_DEFAULT_SOURCE_EXAMPLES = 6000
# Defaults a data set's records name, so that a change of them re-runs its
# cases instead of passing for the recorded runs: SST-2's client rate,
# chosen from these cases (config.DatasetDefaults: at 1.0 and 0.5 its text
# CNN diverged within 60 rounds).
DATASET_SETTINGS = {'sst2': dict(
    client_learning_rate=config_lib.DATASET_DEFAULTS['sst2']
    .client_learning_rate)}
# Settings of one case beyond its data set's, which its records name.
# SST-2 under Dirichlet(0.1): nearly every client holds one class, and
# with the paper's server step (SGD at 1) the models predict one class,
# so no width can beat a standalone model of the other class; Adam on
# the server learns (at 0.01 training-time Aequa diverged). The other
# cases keep the paper's step (docs/benchmarks.md).
CASE_SETTINGS = {('sst2', 'dirichlet'): dict(server_optimizer='adam',
                                             server_learning_rate=0.003)}
_THREE_SEEDS = ('mnist', 'fashion_mnist')

_OUTPUT_DIR = flags.DEFINE_string('output_dir', 'runs/aequa_table',
                                  'Cases and their runs go here.')
_CASES = flags.DEFINE_list(
    'cases', [], 'dataset:partition cases to run (default: every one).')
_SEEDS = flags.DEFINE_list(
    'seeds', [], 'Seeds (default: 0,1,2 for MNIST and Fashion-MNIST, 0 for'
    ' the others).')
_ROUNDS = flags.DEFINE_integer(
    'rounds', None, 'Federated rounds of every case (default: each data'
    " set's budget in ROUNDS).", lower_bound=1)
_SOURCE_EXAMPLES = flags.DEFINE_integer(
    'source_examples', None, 'Stratified subset of every data set'
    " (default: each data set's in SOURCE_EXAMPLES).", lower_bound=1)
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See docs/data.md.')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Gather every finished case here as JSON (schema:'
    ' benchmarks/report.py).')

_COLUMNS = (
    report.Column('dataset', 'data set'),
    report.Column('partition', 'partition'),
    report.Column('method', 'method'),
    report.Column('seeds', 'seeds'),
    report.Column('global_accuracy', 'global acc.', '.4f'),
    report.Column('global_balanced_accuracy', 'global bal. acc.', '.4f'),
    report.Column('pearson', 'Pearson', '.4f'),
    report.Column('pearson_seeds', 'seeds with Pearson'),
    report.Column('pearson_spread', '± (seeds)', '.4f'),
    report.Column('standalone_spread', 'standalone spread', '.4f'),
    report.Column('ir_violations', 'IR violations', '.1f'),
    report.Column('gain_spread', 'gain spread', '.4f'),
    report.Column('case_minutes', 'case minutes', '.1f'))


def _available(dataset: str) -> bool:
  """Whether the data set loads here (TFDS ones only when prepared)."""
  try:
    data_lib.load_source(dataset, _DATA_DIR.value or None, max_examples=10)
  except (errors.UserError, ValueError) as e:
    logging.warning('skipped: %s (%s)', dataset, e)
    return False
  return True


def _cases() -> list[tuple[str, str]]:
  known = [(d, p) for d in DATASETS + TFDS_DATASETS for p in PARTITIONS]
  if not _CASES.value:
    return known
  chosen = [tuple(c.split(':', 1)) for c in _CASES.value]
  unknown = [':'.join(c) for c in chosen if c not in known]
  if unknown:
    raise app.UsageError(
        f'--cases: unknown {", ".join(unknown)}; cases are dataset:partition'
        f' with datasets {", ".join(DATASETS + TFDS_DATASETS)} and'
        f' partitions {", ".join(PARTITIONS)}.')
  return chosen


def _per_dataset(flag: flags.FlagHolder[Optional[int]],
                 budgets: dict[str, int], default: int, dataset: str) -> int:
  """The flag's value if given, else the data set's budget."""
  if flag.value is not None:
    return flag.value
  return budgets.get(dataset, default)


def _seeds(dataset: str) -> list[int]:
  if _SEEDS.value:
    return [int(s) for s in _SEEDS.value]
  return [0, 1, 2] if dataset in _THREE_SEEDS else [0]


def _read(table: str) -> dict[str, dict[str, tuple[float, float]]]:
  """clients_final.csv: kind -> client -> (accuracy, balanced accuracy)."""
  found = {}
  with open(table) as f:
    for row in csv.DictReader(f):
      found.setdefault(row['model'], {})[row['client']] = (
          float(row['accuracy']), float(row['balanced_accuracy']))
  return found


def _run(case_dir: str, dataset: str, partition: str, seed: int, method: str
         ) -> tuple[dict[str, dict[str, tuple[float, float]]], float]:
  """One method's final metrics in a case and the wall seconds of the
  invocation that finished it.

  Trains or resumes the method's run; one that finished with the same
  settings is read back, not evaluated again.
  """
  algorithm, settings, _, _ = METHODS[method]
  run_dir = os.path.join(case_dir, method)
  if method in CONTRIBUTIONS_FROM_AEQUA:
    settings = dict(settings, contributions_file=os.path.join(
        case_dir, 'aequa', rewards_lib.CONTRIBUTIONS_FILE))
  config = registry.make_config(
      algorithm=algorithm, dataset=dataset, num_clients=10,
      clients_per_round=10, validation_fraction=0.1, test_fraction=0.2,
      common_test_evaluation=True, eval_every=0, seed=seed,
      data_dir=_DATA_DIR.value, output_dir=run_dir,
      **PARTITIONS[partition], **_training_settings(dataset, partition),
      **settings)
  seconds = run_files.run_unless_finished(run_dir, config.to_dict(),
                                          lambda: driver.run(config))
  return _read(os.path.join(run_dir, 'clients_final.csv')), seconds


def _records_dir() -> str:
  """--records_dir, by default <output_dir>/records: every case has one."""
  return (run_records.RECORDS_DIR.value
          or os.path.join(_OUTPUT_DIR.value, 'records'))


def _case_name(dataset: str, partition: str, seed: int) -> str:
  return os.path.join(f'{dataset}_{partition}', f'seed{seed}')


def _training_settings(dataset: str, partition: str) -> dict[str, Any]:
  """The settings of a case's training runs beyond its name's."""
  return dict(
      rounds=_per_dataset(_ROUNDS, ROUNDS, _DEFAULT_ROUNDS, dataset),
      source_examples=_per_dataset(_SOURCE_EXAMPLES, SOURCE_EXAMPLES,
                                   _DEFAULT_SOURCE_EXAMPLES, dataset),
      **DATASET_SETTINGS.get(dataset, {}),
      **CASE_SETTINGS.get((dataset, partition), {}))


def _case_settings(dataset: str, partition: str, seed: int) -> dict[str, Any]:
  """What a case's figures depend on: a record of other settings is not
  read back."""
  return dict(dataset=dataset, partition=partition, seed=seed,
              aequa_ir_confidence=AEQUA_IR_CONFIDENCE,
              **_training_settings(dataset, partition))


def _case_dir(dataset: str, partition: str, seed: int) -> str:
  """A case's runs, a directory per training settings: another --rounds
  or --source_examples starts afresh beside the old runs instead of
  meeting their checkpoints. (Another IR confidence re-rewards the same
  runs.)"""
  training = '-'.join(f'{k}={v}'
                      for k, v in sorted(
                          _training_settings(dataset, partition).items()))
  return os.path.join(_OUTPUT_DIR.value, _case_name(dataset, partition, seed),
                      training)


def _case(dataset: str, partition: str,
          seed: int) -> Optional[dict[str, Any]]:
  """Reads one case's record, or runs the case and records its figures.

  A case in which a method's model diverged is named in the log and not
  recorded: the accuracies of a diverged model (near chance) would enter
  the table as if they were results.
  """
  name = _case_name(dataset, partition, seed)
  if figures := run_records.load(_records_dir(), name, _case_settings(
      dataset, partition, seed)):
    return figures
  case_dir = _case_dir(dataset, partition, seed)
  finals, seconds = {}, 0.0
  for method in METHODS:
    finals[method], method_seconds = _run(case_dir, dataset, partition, seed,
                                          method)
    seconds += method_seconds
  diverged = {m: r for m in METHODS if (r := run_files.diverged_round(
      os.path.join(case_dir, m))) is not None}
  if diverged:
    logging.error(
        'Case %s:%s, seed %d, not recorded: the training loss stopped being'
        ' finite (%s). Lower the data set\'s learning rate or its round'
        ' budget (ROUNDS) and run the case again in a fresh --output_dir.',
        dataset, partition, seed, ', '.join(
            f'{m} from round {r}' for m, r in diverged.items()))
    return None
  standalone = finals['aequa']['standalone' + COMMON_TEST]
  clients = sorted(standalone)
  alone = np.array([standalone[c][0] for c in clients])
  methods = {'standalone': dict(pearson=1.0)}
  for method, (_, _, reward, global_kind) in METHODS.items():
    rewards = finals[method][reward + COMMON_TEST]
    pooled = finals[method][global_kind + COMMON_TEST]
    methods[method] = dict(
        pearson=fairness_metrics.pearson_correlation(
            np.array([rewards[c][0] for c in clients]), alone),
        # One model on one set: every client's entry is the same.
        global_accuracy=pooled[clients[0]][0],
        global_balanced_accuracy=pooled[clients[0]][1])
  with open(os.path.join(case_dir, 'aequa', 'aequa_fairness.json')) as f:
    fairness = json.load(f)
  methods['aequa'].update(ir_violations=fairness['ir_violations'],
                          gain_spread=fairness['gain_spread'])
  figures = dict(dataset=dataset, partition=partition, seed=seed,
                 standalone_spread=float(alone.max() - alone.min()),
                 minutes=seconds / 60, methods=methods)
  run_records.save(_records_dir(), name,
                   _case_settings(dataset, partition, seed), figures)
  return figures


def _mean(values: list[Optional[float]]) -> Optional[float]:
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else None


def _rows(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """A row per case and method: means over the seeds that finished."""
  by_case = {}
  for case in cases:
    by_case.setdefault((case['dataset'], case['partition']), []).append(case)
  rows = []
  for (dataset, partition), seeds in by_case.items():
    # A case's figure, as the standalone spread: Aequa's full width over
    # FedAvg-FT's global model in the lowest seed.
    lowest_gap = min(s['methods']['aequa']['global_accuracy']
                     - s['methods']['fedavg_ft']['global_accuracy']
                     for s in seeds)
    for method in ('standalone', *METHODS):
      figures = [s['methods'][method] for s in seeds]
      # Undefined (NaN) where a method rewards every client alike: the
      # mean and spread are over the seeds where it is defined.
      pearsons = [f['pearson'] for f in figures
                  if not np.isnan(f['pearson'])]
      rows.append(dict(
          dataset=dataset, partition=partition, method=method,
          seeds=len(seeds),
          global_accuracy=_mean([f.get('global_accuracy') for f in figures]),
          global_balanced_accuracy=_mean(
              [f.get('global_balanced_accuracy') for f in figures]),
          pearson=_mean(pearsons),
          pearson_seeds=len(pearsons),
          pearson_spread=(max(pearsons) - min(pearsons)
                          if len(pearsons) > 1 else None),
          standalone_spread=_mean([s['standalone_spread'] for s in seeds]),
          ir_violations=_mean([f.get('ir_violations') for f in figures]),
          gain_spread=_mean([f.get('gain_spread') for f in figures]),
          aequa_minus_fedavg_lowest=lowest_gap,
          case_minutes=_mean([s['minutes'] for s in seeds])))
  return rows


_OVERVIEW_COLUMNS = (
    report.Column('dataset', 'data set'),
    report.Column('partition', 'partition'),
    report.Column('seeds', 'seeds'),
    *(report.Column(f'pearson_{m}', f'Pearson {m}', '.3f') for m in METHODS),
    report.Column('standalone_spread', 'standalone spread', '.3f'),
    report.Column('aequa_minus_fedavg', 'Aequa - FedAvg acc.', '+.4f'),
    report.Column('aequa_minus_fedavg_lowest', 'lowest seed', '+.4f'),
    report.Column('ir_violations', 'IR violations', '.1f'))


def _overview(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """A row per case: each method's Pearson, Aequa's full-width accuracy
  over FedAvg-FT's global model's (the mean and the lowest seed's: one
  seed's gap is measured on 1,200 test examples), Aequa's IR violations
  (the targets)."""
  by_case: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
  for row in rows:
    by_case.setdefault((row['dataset'], row['partition']),
                       {})[row['method']] = row
  overview = []
  for (dataset, partition), methods in by_case.items():
    aequa, fedavg = methods['aequa'], methods['fedavg_ft']
    overview.append(dict(
        dataset=dataset, partition=partition, seeds=aequa['seeds'],
        **{f'pearson_{m}': methods[m]['pearson'] for m in METHODS},
        standalone_spread=aequa['standalone_spread'],
        aequa_minus_fedavg=(aequa['global_accuracy']
                            - fedavg['global_accuracy']),
        aequa_minus_fedavg_lowest=aequa['aequa_minus_fedavg_lowest'],
        ir_violations=aequa['ir_violations']))
  return overview


def _every_finished_case() -> list[dict[str, Any]]:
  """Every recorded case of these settings, from any invocation."""
  seeds = sorted({0, 1, 2} | {int(seed) for seed in _SEEDS.value})
  found = []
  for dataset, partition, seed in itertools.product(
      DATASETS + TFDS_DATASETS, PARTITIONS, seeds):
    figures = run_records.load(_records_dir(), _case_name(
        dataset, partition, seed), _case_settings(dataset, partition, seed))
    if figures:
      found.append(figures)
  return found


def _tabulate(results: report.Results) -> list[dict[str, Any]]:
  """Tables every recorded case into `results`; returns the rows."""
  rows = _rows(_every_finished_case())
  results.table('overview', 'Per case (means over the seeds that'
                ' finished): Pearson of reward against standalone accuracy'
                ' by method', _OVERVIEW_COLUMNS, _overview(rows))
  results.table('cases', 'Each case and method: means over the seeds that'
                ' finished', _COLUMNS, rows)
  return rows


def main(argv):
  del argv
  log_filter.keep_info_logs_of_tff_fair_only()
  cases = _cases()
  results = report.Results('aequa_table', {
      f.name: f.value for f in (_OUTPUT_DIR, _CASES, _SEEDS, _ROUNDS,
                                _SOURCE_EXAMPLES, _DATA_DIR,
                                run_records.RECORDS_DIR,
                                run_files.FINISHED_ONLY)})
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  available = {}
  with local_runtime.local_context():
    for dataset, partition in cases:
      if dataset not in available:
        available[dataset] = _available(dataset)
      if not available[dataset]:
        continue
      for seed in _seeds(dataset):
        if run_files.FINISHED_ONLY.value:
          if not run_records.load(_records_dir(), _case_name(
              dataset, partition, seed), _case_settings(
                  dataset, partition, seed)):
            logging.info('Left out, not recorded: case %s:%s, seed %d.',
                         dataset, partition, seed)
          continue
        logging.info('Case %s:%s, seed %d.', dataset, partition, seed)
        try:
          _case(dataset, partition, seed)
        except config_lib.ConfigError as e:
          # E.g. label skew #C=3 on SST-2's two classes: the other cases
          # still run, and this one is named.
          logging.error('Case %s:%s, seed %d, skipped: %s', dataset,
                        partition, seed, e)
          continue
        _tabulate(results)
        results.save(_RESULTS_FILE.value)
  rows = _tabulate(results)
  for row in rows:
    print('  '.join(f'{k}={v}' for k, v in row.items()), flush=True)
  results.write(_RESULTS_FILE.value)


if __name__ == '__main__':
  app.run(main)
