r"""Where a training run's round goes: the driver's phases per algorithm.

Runs `tff_fair.training` (what `programs/train.py` runs: client data,
training, per-client state, per-round evaluation, checkpoints) for each
system on one setting of `benchmarks.timing_settings`, every client every
round, and prints the median over rounds 2..N of each phase the driver
times (`seconds_<phase>` in `metrics.csv`, the checkpoint's from the run's
history) and of the whole round:

  data          building the round's client data sets
  train         the recipe's round: its federated computations, and for
                Ditto the personal step's checks and writes
  personal_*    Ditto's parts of `train`: training, the per-client checks
                of the model each client ends with (train/validation loss
                and accuracy), writing the personal models
  client_state  committing per-client state
  evaluation    every client's test split (`--eval_every=1`)
  checkpoint    the program state and the per-round release
  round         the round's seconds as released (all of the above but the
                checkpoint)

  .venv/bin/python -m benchmarks.round_phases --output_dir=/tmp/phases

Systems: fedavg, ditto (sequential, the default variant), ditto_interleaved
(one pass with both models). Compare with `benchmarks.round_time`, which
times the federated computations alone.

With `--results_file` it also writes the table as JSON
(`benchmarks/report.py`): table `phases`, a row per phase with the median
seconds of each system under the system's name (None where a system has no
such phase).
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import collections
import os

from absl import app
from absl import flags
import numpy as np

from benchmarks import report
from benchmarks import timing_settings
from tff_fair.training import driver
from tff_fair.runtime import execution
from tff_fair.training import log_filter

SYSTEMS = {
    'fedavg': dict(algorithm='fedavg'),
    'ditto': dict(algorithm='ditto', ditto_variant='sequential'),
    'ditto_interleaved': dict(algorithm='ditto',
                              ditto_variant='interleaved'),
}

_SETTING = flags.DEFINE_enum('setting', 'pfllib',
                             list(timing_settings.SETTINGS),
                             'See benchmarks/timing_settings.py.')
_ROUNDS = flags.DEFINE_integer('rounds', 6, 'Rounds per system (>= 3).')
_CLIENTS = flags.DEFINE_integer('clients', 20, 'Clients, all every round.')
_SYSTEMS = flags.DEFINE_list('systems', list(SYSTEMS), 'Systems to run.')
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See the README.')
_OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', None, 'Runs go to <output_dir>/<system> (must be new).')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Also write the results as JSON here (schema:'
    ' benchmarks/report.py).')


def _phases(history: list[dict[str, float]]) -> dict[str, float]:
  """Median seconds per phase over rounds 2.. of a run."""
  rounds = history[1:]
  names = [k for k in rounds[0] if k.startswith('seconds_')] + ['seconds']
  return collections.OrderedDict(
      (name.removeprefix('seconds_') if name != 'seconds' else 'round',
       float(np.median([r[name] for r in rounds])))
      for name in names)


def main(argv):
  del argv
  log_filter.keep_info_logs_of_tff_fair_only()
  timing_settings.check_flags(_ROUNDS.value, _SYSTEMS.value, SYSTEMS)
  setting = timing_settings.SETTINGS[_SETTING.value]
  results = report.Results('round_phases', {
      f.name: f.value for f in (_SETTING, _ROUNDS, _CLIENTS, _SYSTEMS,
                                _DATA_DIR, _OUTPUT_DIR)})
  table = collections.OrderedDict()
  with execution.execution_context('local', ''):
    for system in _SYSTEMS.value:
      extra = dict(SYSTEMS[system])
      if extra['algorithm'] == 'ditto':
        extra['ditto_lambda'] = setting.ditto_lambda
      config = timing_settings.make_config(
          setting, setting.model, clients=_CLIENTS.value,
          rounds=_ROUNDS.value, data_dir=_DATA_DIR.value,
          output_dir=os.path.join(_OUTPUT_DIR.value, system),
          eval_every=1, **extra)
      table[system] = _phases(driver.run(config).history)
  names = list(dict.fromkeys(n for row in table.values() for n in row))
  print(f'Setting {_SETTING.value}, {_CLIENTS.value} clients, median'
        f' seconds over rounds 2..{_ROUNDS.value}:')
  print(f'{"phase":<28}' + ''.join(f'{s:>20}' for s in table))
  for name in names:
    print(f'{name:<28}' + ''.join(
        f'{row[name]:>20.2f}' if name in row else f'{"":>20}'
        for row in table.values()))
  results.table(
      'phases', f'Setting {_SETTING.value}, {_CLIENTS.value} clients, median'
      f' seconds over rounds 2..{_ROUNDS.value}',
      [report.Column('phase', 'phase')] + [
          report.Column(system, system, '.2f') for system in table],
      [dict(phase=name, **{system: row.get(name)
                           for system, row in table.items()})
       for name in names])
  results.write(_RESULTS_FILE.value)


if __name__ == '__main__':
  flags.mark_flag_as_required('output_dir')
  app.run(main)
