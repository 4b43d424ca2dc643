"""Wall time of Aequa's width allocation: exact sweep vs simulated annealing.

Plain script (not a test, not in Bazel):

    .venv/bin/python -m benchmarks.allocation_timing [--clients 1000 10000]

Widths: 76 levels from 0.25 to 1.0 with accuracy rising concavely from 0.5 to
0.9. Contributions: uniform in [0.3, 0.85] ("spread") and N(0.7, 0.005)
("clustered"). For each N the table gives the median wall (and CPU)
time of `solve_exact` and of `solve_annealing` (default options: seeded with the
exact optimum) and the cost ratio annealing / exact; the last column is an
annealing run from the proportional start (no exact seed), to show what the
seed buys.

With `--results_file` it also writes the table as JSON
(`benchmarks/report.py`): table `allocation`, a row per contributions kind
and N with exact_seconds, exact_cpu_seconds, annealing_seconds,
annealing_cpu_seconds, annealing_over_exact and unseeded_over_exact (cost
ratios).
"""

import argparse
import statistics
import time

import numpy as np

from benchmarks import report
from tff_fair.fairness import allocation

WIDTHS = np.linspace(0.25, 1.0, 76)
ACCURACIES = 0.5 + 0.4 * (1 - np.exp(-4 * (WIDTHS - 0.25) / 0.75)) / (
    1 - np.exp(-4))


def _contributions(kind: str, n: int, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  if kind == 'spread':
    return rng.uniform(0.3, 0.85, n)
  return rng.normal(0.7, 0.005, n)


def _timed(fn, repeats: int):
  """Median wall and CPU seconds (CPU: robust to a busy shared machine)."""
  wall, cpu, result = [], [], None
  for _ in range(repeats):
    start, start_cpu = time.perf_counter(), time.process_time()
    result = fn()
    wall.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
  return statistics.median(wall), statistics.median(cpu), result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--clients', type=int, nargs='+', default=[1000, 10000])
  parser.add_argument('--repeats', type=int, default=3,
                      help='runs per timing; the median is reported')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--results_file', default='',
                      help='also write the results as JSON here (schema:'
                      ' benchmarks/report.py)')
  args = parser.parse_args()
  results = report.Results('allocation_timing', vars(args))
  rows = []

  print(f'{len(WIDTHS)} levels; annealing iterations = max(200000, 100 N)')
  header = (f'{"contributions":>13} {"N":>6} {"exact s":>8} {"(cpu)":>6}'
            f' {"anneal s":>9} {"(cpu)":>6} {"anneal/exact":>13}'
            f' {"unseeded/exact":>15}')
  print(header)
  print('-' * len(header))
  for kind in ('spread', 'clustered'):
    for n in args.clients:
      c = _contributions(kind, n, args.seed)
      exact_time, exact_cpu, exact = _timed(
          lambda: allocation.solve_exact(c, WIDTHS, ACCURACIES), args.repeats)
      anneal_time, anneal_cpu, annealed = _timed(
          lambda: allocation.solve_annealing(c, WIDTHS, ACCURACIES,
                                             seed=args.seed), args.repeats)
      unseeded = allocation.solve_annealing(
          c, WIDTHS, ACCURACIES, seed=args.seed, start='proportional')
      print(f'{kind:>13} {n:>6} {exact_time:>8.3f} {exact_cpu:>6.3f}'
            f' {anneal_time:>9.3f} {anneal_cpu:>6.3f}'
            f' {annealed.cost / exact.cost:>13.6f}'
            f' {unseeded.cost / exact.cost:>15.3f}')
      rows.append(dict(
          contributions=kind, clients=n, exact_seconds=exact_time,
          exact_cpu_seconds=exact_cpu, annealing_seconds=anneal_time,
          annealing_cpu_seconds=anneal_cpu,
          annealing_over_exact=annealed.cost / exact.cost,
          unseeded_over_exact=unseeded.cost / exact.cost))
  results.table('allocation', f'Width allocation over {len(WIDTHS)} levels:'
                ' median seconds (CPU seconds) and cost ratios', (
                    report.Column('contributions', 'contributions'),
                    report.Column('clients', 'clients', ',d'),
                    report.Column('exact_seconds', 'exact s', '.3f'),
                    report.Column('exact_cpu_seconds', 'exact CPU s', '.3f'),
                    report.Column('annealing_seconds', 'annealing s', '.3f'),
                    report.Column('annealing_cpu_seconds', 'annealing CPU s',
                                  '.3f'),
                    report.Column('annealing_over_exact',
                                  'annealing / exact cost', '.6f'),
                    report.Column('unseeded_over_exact',
                                  'unseeded annealing / exact cost', '.3f')),
                rows)
  results.write(args.results_file)


if __name__ == '__main__':
  main()
