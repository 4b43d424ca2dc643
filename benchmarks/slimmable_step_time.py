"""Forward+backward step time of the slimmable CIFAR CNN at two widths.

Plain script (not a test, not in Bazel), from the repository root:

    .venv/bin/python benchmarks/slimmable_step_time.py [--batch 64 --steps 50]
        [--concurrent_clients 4] [--threads 1]

One `tf.function` training step takes the width as a tensor argument (traced
once, shapes dynamic), so this measures what the TFF computation runs. Widths
are timed in interleaved rounds; the median per-step time is reported, with
the ratio narrow / full and, for reference, the non-slimmable
`architectures.cifar_cnn` step and the multiply-accumulate ratio.

With one client on every core (the default) the full width's large
convolutions split across cores and the narrow width's small ones hardly
do, so the ratio also measures how well small ops parallelize. A federated
round trains its clients concurrently, sharing the cores:
`--concurrent_clients=4` times that (wall time per step, over all
clients), and `--threads=1` the work of one step on one thread.
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import argparse
import os
import statistics
import sys
import threading
import time

import numpy as np
import tensorflow as tf

# Run as a script: make the repository root importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fair.models import architectures
from tff_fair.models import slimmable
from tff_fair.models import slimmable_models
# Imported for its side effect: TFF's import-time context (pulled in by
# model_fns) is replaced by one that exits cleanly.
from tff_fair.runtime import local  # pylint: disable=unused-import


def _step_fn(model, optimizer, loss_fn, slim: bool):
  if slim:
    @tf.function
    def step(x, y, width):
      with tf.GradientTape() as tape:
        logits = model(slimmable.slimmable_inputs(x, width), training=True)
        loss = loss_fn(y, logits)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss
  else:
    @tf.function
    def step(x, y, width):
      del width
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
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


def _model_step(build, loss_fn, slim: bool):
  model = build(seed=0)
  optimizer = tf.keras.optimizers.SGD(0.01)
  optimizer.build(model.trainable_variables)  # No variables made in a trace.
  return _step_fn(model, optimizer, loss_fn, slim=slim)


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--steps', type=int, default=50)
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument('--narrow', type=float, default=0.25)
  parser.add_argument('--threads', type=int, default=0,
                      help='TensorFlow threads (0: TensorFlow\'s default).')
  parser.add_argument('--concurrent_clients', type=int, default=1,
                      help='Models stepping at once, one Python thread each.')
  args = parser.parse_args()
  if args.threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

  rng = np.random.default_rng(0)
  x = tf.constant(rng.random((args.batch, 32, 32, 3), np.float32))
  y = tf.constant(rng.integers(0, 10, args.batch), tf.int32)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  clients = range(args.concurrent_clients)
  steps = [_model_step(slimmable_models.cifar_cnn, loss_fn, slim=True)
           for _ in clients]
  ref_steps = [_model_step(architectures.cifar_cnn, loss_fn, slim=False)
               for _ in clients]
  narrow = tf.constant(args.narrow, tf.float32)
  full = tf.constant(1.0, tf.float32)
  for step, ref_step in zip(steps, ref_steps):
    for _ in range(5):  # Warm-up (trace once, then steady state).
      step(x, y, narrow), step(x, y, full), ref_step(x, y, full)
  traces = steps[0].experimental_get_tracing_count()

  times = {'narrow': [], 'full': [], 'reference': []}
  for _ in range(args.rounds):
    times['narrow'].append(_time(steps, x, y, narrow, args.steps))
    times['full'].append(_time(steps, x, y, full, args.steps))
    times['reference'].append(_time(ref_steps, x, y, full, args.steps))
  med = {k: statistics.median(v) for k, v in times.items()}
  best = {k: min(v) for k, v in times.items()}

  threads = args.threads or 'default'
  print(f'slimmable cifar_cnn, batch {args.batch}, {args.steps} steps x'
        f' {args.rounds} rounds, {args.concurrent_clients} client(s) at once,'
        f' TensorFlow threads: {threads}, tf.function traced {traces}'
        ' time(s); ms/step as median (best)')
  for label, key in ((f'width {args.narrow:.2f}', 'narrow'),
                     ('width 1.00', 'full'),
                     ('reference (non-slimmable) cifar_cnn', 'reference')):
    print(f'  {label}: {1e3 * med[key]:.2f} ({1e3 * best[key]:.2f})')
  print(f'  step-time ratio {args.narrow:.2f} / 1.00:'
        f' {med["narrow"] / med["full"]:.3f} median,'
        f' {best["narrow"] / best["full"]:.3f} best (target <= 0.3)')
  model = slimmable_models.cifar_cnn(seed=0)
  macs = {w: slimmable.multiply_accumulates(model, w)
          for w in (args.narrow, 1.0)}
  print(f'  MACs/example: {macs[args.narrow]:,} vs {macs[1.0]:,}'
        f' (ratio {macs[args.narrow] / macs[1.0]:.3f}); active parameters:'
        f' {slimmable.active_parameter_count(model, args.narrow):,} vs'
        f' {slimmable.active_parameter_count(model, 1.0):,}')


if __name__ == '__main__':
  main()
