"""Forward+backward step time of a slimmable model at two widths.

Plain script (not a test, not in Bazel), from the repository root:

    .venv/bin/python benchmarks/slimmable_step_time.py [--batch 64 --steps 50]
        [--concurrent_clients 4] [--threads 1] [--model cifar_cnn]

One `tf.function` training step takes the width as a tensor argument (traced
once, shapes dynamic), so this measures what the TFF computation runs. Widths
are timed in interleaved rounds; the median per-step time is reported, with
the ratio narrow / full and, for reference, the non-slimmable model's step
and the multiply-accumulate ratio. Also timed: the narrow width known at
trace time (static shapes), and Aequa's step (the full width plus the narrow
one, one gradient step on the sum) against a step of the reference model
that runs its forward pass twice: what Aequa's step costs over FedAvg's on
this stack, and how much of it is the second pass's dynamic shapes.

Aequa's issue setting (PFLlib's CNN, batch 10):

    .venv/bin/python benchmarks/slimmable_step_time.py --model=fedavg_cnn \
        --batch=10 --narrow=0.55

With one client on every core (the default) the full width's large
convolutions split across cores and the narrow width's small ones hardly
do, so the ratio also measures how well small ops parallelize. A federated
round trains its clients concurrently, sharing the cores:
`--concurrent_clients=4` times that (wall time per step, over all
clients), and `--threads=1` the work of one step on one thread.

With `--results_file` it also writes the results as JSON
(`benchmarks/report.py`): table `steps` (a row per step timed: step,
median_ms and best_ms per step), table `ratios` (ratio, median, best) and
table `arithmetic` (width, multiply_accumulates per example,
active_parameters).
"""

import os
import sys

# Run as a script: make the repository root importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup
quiet_startup.import_tensorflow_quietly()

import argparse
import statistics
import threading
import time

import numpy as np
import tensorflow as tf

from benchmarks import report
from tff_fair.models import model_fns
from tff_fair.models import slimmable
# Imported for its side effect: TFF's import-time context (pulled in by
# model_fns) is replaced by one that exits cleanly.
from tff_fair.runtime import local  # pylint: disable=unused-import


# Image models with a slimmable version, and their inputs' shape.
_INPUT_SHAPES = {'lenet': (28, 28, 1), 'fedavg_cnn': (28, 28, 1),
                 'ditto_cnn': (28, 28, 1), 'cifar_cnn': (32, 32, 3)}


def _step_fn(model, optimizer, loss_fn, slim: bool, sandwich: bool = False,
             static_width=None):
  """A training step `step(x, y, width)`.

  slim: the model takes `slimmable_inputs(x, width)`; else the width is
  ignored. sandwich: the loss is summed over two forward passes (for a slim
  model the full width and `width`, as Aequa's step). static_width: a slim
  model runs at this Python width, known at trace time, not `width`.
  """

  def forward(x, width):
    if not slim:
      return model(x, training=True)
    if static_width is not None:
      width = static_width
    return model(slimmable.slimmable_inputs(x, width), training=True)

  @tf.function
  def step(x, y, width):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, forward(x, width))
      if sandwich:
        loss += loss_fn(y, forward(x, tf.constant(1.0)) if slim else
                        forward(x, width))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  return step


def _run(step, x, y, width, steps) -> None:
  for _ in range(steps):
    loss = step(x, y, width)
  loss.numpy()  # Waits for the last step.


def _time(step_fns, x, y, width, steps) -> float:
  """Wall time per step, all `step_fns` (one per client) concurrently."""
  threads = [threading.Thread(target=_run, args=(fn, x, y, width, steps))
             for fn in step_fns]
  start = time.perf_counter()
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  return (time.perf_counter() - start) / (steps * len(step_fns))


def _model_step(model_name, loss_fn, slim: bool, **kwargs):
  spec = model_fns.build_model_spec(
      f'slimmable_{model_name}' if slim else model_name,
      x_shape=_INPUT_SHAPES[model_name], x_dtype=tf.float32, y_shape=(),
      num_classes=10)
  model = spec.build_keras(0)
  optimizer = tf.keras.optimizers.SGD(0.01)
  optimizer.build(model.trainable_variables)  # No variables made in a trace.
  return _step_fn(model, optimizer, loss_fn, slim=slim, **kwargs), model


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--steps', type=int, default=50)
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument('--narrow', type=float, default=0.25)
  parser.add_argument('--model', default='cifar_cnn',
                      choices=sorted(_INPUT_SHAPES))
  parser.add_argument('--threads', type=int, default=0,
                      help='TensorFlow threads (0: TensorFlow\'s default).')
  parser.add_argument('--concurrent_clients', type=int, default=1,
                      help='Models stepping at once, one Python thread each.')
  parser.add_argument('--results_file', default='',
                      help='Also write the results as JSON here (schema:'
                      ' benchmarks/report.py).')
  args = parser.parse_args()
  results = report.Results('slimmable_step_time', vars(args))
  if args.threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

  rng = np.random.default_rng(0)
  x = tf.constant(rng.random((args.batch, *_INPUT_SHAPES[args.model]),
                             np.float32))
  y = tf.constant(rng.integers(0, 10, args.batch), tf.int32)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  narrow = tf.constant(args.narrow, tf.float32)
  full = tf.constant(1.0, tf.float32)
  # Row label -> (step options, width passed); one model per client each.
  rows = {
      f'width {args.narrow:.2f}': (dict(slim=True), narrow),
      f'width {args.narrow:.2f}, known at trace time': (
          dict(slim=True, static_width=args.narrow), narrow),
      'width 1.00': (dict(slim=True), full),
      f'reference (non-slimmable) {args.model}': (dict(slim=False), full),
      f'Aequa step: width 1.00 + {args.narrow:.2f}': (
          dict(slim=True, sandwich=True), narrow),
      'reference, two forward passes': (dict(slim=False, sandwich=True),
                                        full),
  }
  steps = {label: [_model_step(args.model, loss_fn, **options)[0]
                   for _ in range(args.concurrent_clients)]
           for label, (options, _) in rows.items()}
  for label, fns in steps.items():
    for fn in fns:
      for _ in range(5):  # Warm-up (trace once, then steady state).
        fn(x, y, rows[label][1])
  traces = steps['width 1.00'][0].experimental_get_tracing_count()

  times = {label: [] for label in rows}
  for _ in range(args.rounds):
    for label, fns in steps.items():
      times[label].append(_time(fns, x, y, rows[label][1], args.steps))
  med = {k: statistics.median(v) for k, v in times.items()}
  best = {k: min(v) for k, v in times.items()}

  threads = args.threads or 'default'
  print(f'slimmable {args.model}, batch {args.batch}, {args.steps} steps x'
        f' {args.rounds} rounds, {args.concurrent_clients} client(s) at once,'
        f' TensorFlow threads: {threads}, tf.function traced {traces}'
        ' time(s); ms/step as median (best)')
  for label in rows:
    print(f'  {label}: {1e3 * med[label]:.2f} ({1e3 * best[label]:.2f})')
  labels = list(rows)
  ratios = []
  for label, num, den in (
      (f'{args.narrow:.2f} / 1.00', labels[0], labels[2]),
      (f'{args.narrow:.2f} known / 1.00', labels[1], labels[2]),
      ('Aequa step / reference step', labels[4], labels[3]),
      ('two reference passes / one', labels[5], labels[3])):
    print(f'  step-time ratio {label}: {med[num] / med[den]:.3f} median,'
          f' {best[num] / best[den]:.3f} best')
    ratios.append(dict(ratio=label, median=med[num] / med[den],
                       best=best[num] / best[den]))
  model = _model_step(args.model, loss_fn, slim=True)[1]
  macs = {w: slimmable.multiply_accumulates(model, w)
          for w in (args.narrow, 1.0)}
  print(f'  MACs/example: {macs[args.narrow]:,} vs {macs[1.0]:,}'
        f' (ratio {macs[args.narrow] / macs[1.0]:.3f}); active parameters:'
        f' {slimmable.active_parameter_count(model, args.narrow):,} vs'
        f' {slimmable.active_parameter_count(model, 1.0):,}')
  results.table(
      'steps', f'Slimmable {args.model}, batch {args.batch},'
      f' {args.concurrent_clients} client(s) at once, TensorFlow threads:'
      f' {threads}; ms per step', (
          report.Column('step', 'step'),
          report.Column('median_ms', 'median ms', '.2f'),
          report.Column('best_ms', 'best ms', '.2f')),
      [dict(step=label, median_ms=1e3 * med[label],
            best_ms=1e3 * best[label]) for label in rows])
  results.table('ratios', 'Step-time ratios', (
      report.Column('ratio', 'ratio'),
      report.Column('median', 'of medians', '.3f'),
      report.Column('best', 'of bests', '.3f')), ratios)
  results.table('arithmetic', 'Work per example', (
      report.Column('width', 'width', '.2f'),
      report.Column('multiply_accumulates', 'multiply-accumulates', ',d'),
      report.Column('active_parameters', 'active parameters', ',d')),
      [dict(width=w, multiply_accumulates=macs[w],
            active_parameters=slimmable.active_parameter_count(model, w))
       for w in (args.narrow, 1.0)])
  results.write(args.results_file)


if __name__ == '__main__':
  main()
