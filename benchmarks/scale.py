r"""Scale: Ditto at 1,000 vs 10,000 clients; FedAvg local vs two workers.

One run. Every configuration runs `programs.train` in its own process, the
way users run it, while this script samples the resident memory of that
process and of its TFF worker(s) every 0.1 s.

1. Ditto, Fashion-MNIST, Dirichlet(0.5), 20 clients sampled per round, 10
   rounds, with 1,000 and with 10,000 clients in total. Both use
   `--dirichlet_top_up` (10,000 clients of ~7 examples cannot be served by
   NIID-Bench's redraws; see tff_fair.data.partition.dirichlet), so the two
   runs differ only in the number of clients; and both cap each client's
   pool at 7 examples (`--examples_per_client=7`, the mean at 10,000
   clients; 0 lifts the cap), so a sampled client brings the same work in
   both and round times compare the runtime's cost per client, not data
   sizes (uncapped, a client at 1,000 clients holds 10x the examples).
   Reported: peak RSS of driver plus worker, median round time (rounds 2-10), and the final evaluation of
   every client's personalized and global model (O(clients), after training).
2. FedAvg, 100 clients, 20 per round, 10 rounds: the local runtime vs two
   loopback workers (`programs.worker`) through TFF's mergeable context.
   Round time is the median of rounds 3-10: the first rounds on several
   workers pay a one-time compilation to mergeable form (see round 1 in
   each run's metrics.csv).

  .venv/bin/python -m benchmarks.scale --output_dir=runs/bench_scale

Targets: peak RSS at 10,000 clients <= 1.2 x at 1,000; round time within 20%.

With `--results_file` it also writes the results as JSON
(`benchmarks/report.py`): table `runs` (a row per run: run, clients,
executor, peak_rss_mb, median_seconds_per_round, total_seconds) and table
`ratios` (ratio, value).
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import csv
import os
import shutil
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags
import numpy as np
import portpicker
import psutil

from benchmarks import report

_OUTPUT_DIR = flags.DEFINE_string('output_dir', 'runs/bench_scale',
                                  'Runs and the result table go here.')
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See the README.')
_ROUNDS = flags.DEFINE_integer('rounds', 10, 'Rounds of every run.')
_EXAMPLES_PER_CLIENT = flags.DEFINE_integer(
    'examples_per_client', 7, 'Cap on each Ditto client\'s pool (0: none).')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Also write the results as JSON here (schema:'
    ' benchmarks/report.py).')

_COLUMNS = ('run', 'clients', 'executor', 'peak_rss_mb',
            'median_seconds_per_round', 'total_seconds')


def _tree_rss(process: psutil.Process) -> int:
  total = 0
  for p in [process] + process.children(recursive=True):
    try:
      total += p.memory_info().rss
    except psutil.Error:
      pass
  return total


def _run_program(name: str, flags_: dict, extra_pids=()) -> dict:
  """Runs programs.train afresh; returns peak RSS and round times."""
  out = os.path.join(_OUTPUT_DIR.value, name)
  shutil.rmtree(out, ignore_errors=True)  # A benchmark never resumes.
  args = [sys.executable, '-m', 'programs.train', f'--output_dir={out}',
          f'--data_dir={_DATA_DIR.value}', f'--rounds={_ROUNDS.value}',
          '--eval_every=0', '--seed=0'] + [f'--{k}={v}'
                                            for k, v in flags_.items()]
  start = time.monotonic()
  program = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
  peak = [0]
  extra = [psutil.Process(pid) for pid in extra_pids]

  def sample():
    root = psutil.Process(program.pid)
    while program.poll() is None:
      try:
        peak[0] = max(peak[0], _tree_rss(root) +
                      sum(_tree_rss(p) for p in extra))
      except psutil.Error:
        pass
      time.sleep(0.1)

  sampler = threading.Thread(target=sample)
  sampler.start()
  stderr = program.communicate()[1]
  sampler.join()
  if program.returncode:
    raise RuntimeError(f'{name} failed:\n{stderr[-3000:]}')
  with open(os.path.join(out, 'metrics.csv')) as f:
    seconds = [float(row['seconds']) for row in csv.DictReader(f)]
  return dict(peak_rss_mb=peak[0] / 2**20, seconds=seconds,
              total_seconds=time.monotonic() - start)


def _start_workers(count: int) -> list[tuple[subprocess.Popen, int]]:
  from tff_fair.runtime import remote  # pylint: disable=g-import-not-at-top
  workers = []
  for _ in range(count):
    port = portpicker.pick_unused_port()
    process = subprocess.Popen(
        [sys.executable, '-m', 'programs.worker', f'--port={port}'],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers.append((process, port))
    remote.wait_until_ready(remote.WorkerAddress('localhost', port), process)
  return workers


def main(argv):
  del argv
  results = report.Results('scale', {
      f.name: f.value for f in (_OUTPUT_DIR, _DATA_DIR, _ROUNDS,
                                _EXAMPLES_PER_CLIENT)})
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  rows = []
  ditto = dict(algorithm='ditto', dataset='fashion_mnist',
               partition='dirichlet', alpha=0.5, dirichlet_top_up=True,
               examples_per_client=_EXAMPLES_PER_CLIENT.value,
               clients_per_round=20)
  for clients in (1000, 10000):
    result = _run_program(f'ditto_{clients}', dict(ditto,
                                                    num_clients=clients))
    rows.append(dict(run='ditto', clients=clients, executor='local',
                     median_seconds_per_round=np.median(result['seconds'][1:]),
                     **{k: result[k] for k in ('peak_rss_mb',
                                               'total_seconds')}))
  fed_avg = dict(algorithm='fedavg', dataset='fashion_mnist',
                 partition='dirichlet', alpha=0.5, num_clients=100,
                 clients_per_round=20)
  runs = [('local', fed_avg, ())]
  workers = _start_workers(2)
  try:
    spec = ','.join(f'localhost:{port}' for _, port in workers)
    runs.append(('2 workers', dict(fed_avg, executor='remote', workers=spec),
                 [p.pid for p, _ in workers]))
    for executor, flags_, pids in runs:
      result = _run_program(f'fedavg_{executor.replace(" ", "_")}', flags_,
                            pids)
      rows.append(dict(run='fedavg', clients=100, executor=executor,
                       median_seconds_per_round=np.median(
                           result['seconds'][2:]),
                       **{k: result[k] for k in ('peak_rss_mb',
                                                 'total_seconds')}))
  finally:
    for process, _ in workers:
      process.kill()
      process.wait()

  with open(os.path.join(_OUTPUT_DIR.value, 'scale.csv'), 'w',
            newline='') as f:
    writer = csv.DictWriter(f, fieldnames=_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  print(f'{"run":8} {"clients":>8} {"executor":>10} {"peak RSS MB":>12}'
        f' {"s/round":>8} {"total s":>8}')
  for r in rows:
    print(f'{r["run"]:8} {r["clients"]:>8} {r["executor"]:>10}'
          f' {r["peak_rss_mb"]:>12.0f} {r["median_seconds_per_round"]:>8.2f}'
          f' {r["total_seconds"]:>8.0f}')
  small, large, local, distributed = rows
  rss_ratio = large['peak_rss_mb'] / small['peak_rss_mb']
  time_ratio = (large['median_seconds_per_round'] /
                small['median_seconds_per_round'])
  workers_ratio = (distributed['median_seconds_per_round'] /
                   local['median_seconds_per_round'])
  print(f'Ditto 10,000 / 1,000 clients: peak RSS {rss_ratio:.2f}x (target'
        f' <= 1.2x), round time {time_ratio:.2f}x (target 0.8-1.2x).')
  print(f'FedAvg, two loopback workers / local: round time'
        f' {workers_ratio:.2f}x.')
  results.table('runs', 'Peak memory and round time', (
      report.Column('run', 'run'),
      report.Column('clients', 'clients', ',d'),
      report.Column('executor', 'executor'),
      report.Column('peak_rss_mb', 'peak RSS (MB)', '.0f'),
      report.Column('median_seconds_per_round', 's/round (median)', '.2f'),
      report.Column('total_seconds', 'total s', '.0f')), rows)
  results.table('ratios', 'Ratios', (
      report.Column('ratio', 'ratio'), report.Column('value', 'value', '.2f')),
      [dict(ratio='Ditto, 10,000 / 1,000 clients: peak RSS', value=rss_ratio),
       dict(ratio='Ditto, 10,000 / 1,000 clients: s/round',
            value=time_ratio),
       dict(ratio='FedAvg, two loopback workers / local: s/round',
            value=workers_ratio)])
  results.write(_RESULTS_FILE.value)

if __name__ == '__main__':
  app.run(main)
