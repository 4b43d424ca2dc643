r"""Seconds per training round: tff_fair against TFF and a plain TF loop.

In one process and one run, on the same client data, model and batches,
round by round, each system in turn (so a drift of the machine's speed
falls on every system alike):

  (a) the same SGD steps in a plain TensorFlow loop over the clients (one
      model; two for Ditto; for Aequa the slimmable model's full width plus
      one width drawn from [0.1, 1) per step: the floor this stack sets);
      `a_plain_tf_xla`: the same loop with each step compiled by XLA
      (`jit_compile`; not for Aequa: XLA compiles a program per set of
      shapes, and a width drawn per step changes them almost every step),
  (b) TFF's `tff.learning.algorithms.build_weighted_fed_avg`,
  (c) tff_fair's FedAvg (`fed_avg.build_fed_avg`),
  (d) tff_fair's Ditto: `personalize` + `next`, sequential and
      interleaved, and `personalize_and_next` (interleaved in one pass),
  (e) tff_fair's Aequa (slimmable model, one sampled width per step), and
      `e_aequa_full_width`: the full width only (`widths_per_step=0`), the
      slimmable model's own overhead over FedAvg's,
  (g) the personalization methods' global rounds: FedProx, Per-FedAvg
      (first-order and Hessian-free), FedRep (one head epoch, one body
      epoch) and pFedMe (its default K inner steps per batch), each
      against (c); their gradient passes per batch over FedAvg's are 1, 2,
      4, 2 (the head's pass backpropagates through the last layer only)
      and K,
  (f) training-time Aequa (`aequa_rewards`, masked aggregation) with every
      client at p_max, as in its first round (its most expensive), and
      `f_aequa_rewards_spread`: the clients' maximum widths spread evenly
      from p_min to p_max (client k of n at p_min + k (1 - p_min) / (n - 1)),
      a federation whose contributions differ, as in later rounds,

training time only (data sets are built before the clock starts; nothing is
evaluated), every client every round; median, min and max over rounds
2..N (round 1 pays for tracing), and the ratios b/a, c/a, d/c, d/a, e/c,
f/c, f spread/c, g/c per method, and 'a ditto/a' and 'a aequa/a': Ditto's and Aequa's SGD
steps over FedAvg's in the plain loop, the ratios no runtime can beat
(Ditto trains two models on every batch, Aequa two widths).

Each round's CPU seconds are measured too (this process and its children,
i.e. TFF's worker, from /proc): the work a round costs, whatever share of
the cores it keeps busy. 'cores' is CPU seconds over seconds. Every ratio
is given in both: the plain loop trains one client at a time and leaves
part of the second core idle, TFF runs clients side by side and keeps both
busy, so on this machine a TFF ratio can be compared with the plain loop's
ratio of CPU seconds, the work of the same steps.

Settings (`benchmarks.timing_settings`): `--setting=pfllib` (the PFLlib
comparison, PFLlib's FedAvgCNN) or `--setting=readme` (the README's Ditto
benchmark, LeNet). `--model` swaps the architecture (e.g. `ditto_cnn`, the
Ditto reference's 'same'-padded CNN with dense 1024, about 3x the
arithmetic).

  .venv/bin/python -m benchmarks.round_time --setting=pfllib --rounds=10

A ratio measured while other jobs share the cores is not comparable: run it
on an idle machine.

With `--results_file` it also writes the results as JSON
(`benchmarks/report.py`): table `systems` (a row per system: median_seconds,
min_seconds, max_seconds, median_cpu_seconds, median_cores) and table
`ratios` (a row per ratio: of_seconds, of_cpu_seconds).
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import collections
import csv
import os
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from benchmarks import report
from benchmarks import timing_settings
from tff_fair.algorithms import aequa
from tff_fair.algorithms import aequa_rewards
from tff_fair.algorithms import ditto
from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import fedrep
from tff_fair.algorithms import per_fedavg
from tff_fair.algorithms import pfedme
from tff_fair.models import model_fns
from tff_fair.models import names as model_names
from tff_fair.models import slimmable
from tff_fair.runtime import local as local_runtime
from tff_fair.training import driver
from tff_fair.training import log_filter
from tff_fair.training import sampling
from tff_fair.training.recipes import fedprox

SETTINGS = timing_settings.SETTINGS
SYSTEMS = ('a_plain_tf', 'a_plain_tf_xla', 'a_plain_tf_ditto',
           'a_plain_tf_aequa',
           'b_tff_fedavg', 'c_fedavg',
           'd_ditto_sequential', 'd_ditto_interleaved', 'd_ditto_fused',
           'e_aequa', 'e_aequa_full_width',
           'f_aequa_rewards', 'f_aequa_rewards_spread',
           'g_fedprox', 'g_per_fedavg_fo', 'g_per_fedavg_hf', 'g_fedrep',
           'g_pfedme')
# Systems that train the slimmable version of the architecture.
SLIMMABLE_SYSTEMS = ('a_plain_tf_aequa', 'e_aequa', 'e_aequa_full_width',
                     'f_aequa_rewards', 'f_aequa_rewards_spread')
# Aequa's smallest width (`aequa.build_aequa`'s default).
P_MIN = 0.1
# FedProx's mu (any value > 0 costs the same).
FEDPROX_MU = 0.01

_SETTING = flags.DEFINE_enum('setting', 'pfllib', list(SETTINGS),
                             'Model, batch size, learning rate (see above).')
_ROUNDS = flags.DEFINE_integer('rounds', 10, 'Rounds per system (>= 3).')
_CLIENTS = flags.DEFINE_integer('clients', 20, 'Clients, all every round.')
_SYSTEMS = flags.DEFINE_list('systems', list(SYSTEMS), 'Systems to time.')
_MODEL = flags.DEFINE_enum('model', None, list(model_names.PLAIN_MODELS),
                           "The architecture; default the setting's.")
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See the README.')
_OUTPUT = flags.DEFINE_string('output_csv', '', 'Also write the table here.')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Also write the results as JSON here (schema:'
    ' benchmarks/report.py).')


def _model() -> str:
  return _MODEL.value or SETTINGS[_SETTING.value].model


def _config(algorithm: str):
  model = _model()
  return timing_settings.make_config(
      SETTINGS[_SETTING.value],
      f'slimmable_{model}' if algorithm == 'aequa' else model, algorithm,
      clients=_CLIENTS.value, rounds=_ROUNDS.value,
      data_dir=_DATA_DIR.value, output_dir='unused')


class PlainLoop:
  """The same SGD steps in plain TensorFlow: the floor of this stack."""

  def __init__(self, spec: model_fns.ModelSpec, learning_rate: float,
               lam: float = -1.0, sandwich: bool = False,
               jit_compile: bool = False):
    self._model = spec.build_keras(0)
    self._sandwich = sandwich
    # One step as XLA's unit of compilation; without XLA it is inlined.
    self._step = (tf.function(self._sgd_step, jit_compile=True)
                  if jit_compile else self._sgd_step)
    self._loss = model_fns.loss_fn(spec.masks_padding)
    self._optimizer = tf.keras.optimizers.SGD(learning_rate)
    self._optimizer.build(self._model.trainable_variables)
    self._global = [w.numpy() for w in self._model.weights]
    self._lam = lam
    self._personal_model = spec.build_keras(0) if lam >= 0 else None
    self._anchor = [tf.Variable(v) for v in self._model.trainable_variables]
    self._personal = {}
    self._learning_rate = learning_rate

  @tf.function
  def _train(self, dataset):
    """One pass of SGD steps over `dataset`, in one graph (as TFF's reduce)."""
    count = tf.constant(0)
    for batch in dataset:
      self._step(batch)
      count += tf.shape(batch['y'])[0]
    return count

  def _sgd_step(self, batch):
    with tf.GradientTape() as tape:
      loss = self._loss(batch['y'], self._model(batch['x'], training=True))
      if self._sandwich:  # Aequa's step: the full width and a drawn one.
        width = tf.random.uniform([], P_MIN, 1.0)
        loss += self._loss(batch['y'], self._model(
            slimmable.slimmable_inputs(batch['x'], width), training=True))
    grads = tape.gradient(loss, self._model.trainable_variables)
    self._optimizer.apply_gradients(
        zip(grads, self._model.trainable_variables))

  @tf.function
  def _train_personal(self, dataset):
    """Ditto's personal pass: SGD on F_k(v) + (lam/2)||v - anchor||^2."""
    model = self._personal_model
    for batch in dataset:
      with tf.GradientTape() as tape:
        loss = self._loss(batch['y'], model(batch['x'], training=True))
      grads = tape.gradient(loss, model.trainable_variables)
      for v, g, a in zip(model.trainable_variables, grads, self._anchor):
        v.assign_sub(self._learning_rate * (g + self._lam * (v - a)))

  def round(self, client_ids, datasets) -> None:
    totals = None
    count = 0
    for cid, ds in zip(client_ids, datasets):
      self._model.set_weights(self._global)
      if self._personal_model is not None:
        for v, a in zip(self._model.trainable_variables, self._anchor):
          a.assign(v)
        self._personal_model.set_weights(self._personal.get(cid,
                                                            self._global))
        self._train_personal(ds)
        self._personal[cid] = self._personal_model.get_weights()
      n = int(self._train(ds))
      weights = self._model.get_weights()
      totals = ([w * n for w in weights] if totals is None else
                [t + w * n for t, w in zip(totals, weights)])
      count += n
    self._global = [t / count for t in totals]


def _cpu_seconds() -> float:
  """User + system CPU seconds of this process and its descendants."""
  tick = os.sysconf('SC_CLK_TCK')
  children = collections.defaultdict(list)
  cpu = {}
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat') as f:
        # Fields after the command name: state, ppid, ..., utime, stime.
        fields = f.read().rsplit(')', 1)[1].split()
    except OSError:  # The process ended meanwhile.
      continue
    children[int(fields[1])].append(int(entry))
    cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
  total, pending = 0.0, [os.getpid()]
  while pending:
    pid = pending.pop()
    total += cpu.get(pid, 0.0)
    pending.extend(children.get(pid, ()))
  return total


def _process(system: str, experiment, learning_rate: float):
  spec = experiment.model_spec
  client_optimizer = tff.learning.optimizers.build_sgdm(learning_rate)
  if system == 'b_tff_fedavg':
    return tff.learning.algorithms.build_weighted_fed_avg(
        spec.model_fn, client_optimizer)
  if system == 'c_fedavg':
    return fed_avg.build_fed_avg(spec.model_fn, client_optimizer)
  if system.startswith('d_ditto'):
    return ditto.build_ditto(spec.model_fn, client_optimizer,
                             personal_optimizer_fn=client_optimizer)
  if system == 'g_fedprox':
    return fed_avg.build_fed_avg(
        spec.model_fn, client_optimizer,
        training_loop_fn=fedprox.proximal_training_loop(FEDPROX_MU))
  if system.startswith('g_per_fedavg'):
    return per_fedavg.build_per_fedavg(
        spec.model_fn, client_optimizer, alpha=learning_rate,
        variant=system.rsplit('_', 1)[1])
  if system == 'g_fedrep':
    return fedrep.build_fedrep(spec.model_fn, client_optimizer,
                               head_variables=spec.head_variables)
  if system == 'g_pfedme':
    return pfedme.build_pfedme(spec.model_fn, client_optimizer)
  if system.startswith('f_aequa_rewards'):
    # Without client context every client trains up to p_max; with it,
    # each client's input carries its maximum width.
    return aequa_rewards.build_aequa_rewards(
        spec.model_fn, client_optimizer,
        keras_model_fn=lambda: spec.build_keras(None), p_min=P_MIN,
        client_context=system == 'f_aequa_rewards_spread')
  return aequa.build_aequa(
      spec.model_fn, client_optimizer,
      widths_per_step=0 if system == 'e_aequa_full_width' else 1)


class _TimedSystem:
  """One system's process (or plain loop), state and data, a round at a time."""

  def __init__(self, system: str):
    self.system = system
    setting = SETTINGS[_SETTING.value]
    self._lam = setting.ditto_lambda
    self._experiment = driver.build_experiment(
        _config('aequa' if system in SLIMMABLE_SYSTEMS else 'fedavg'))
    self._ids = self._experiment.data.client_ids
    self._plain = system.startswith('a_plain')
    if self._plain:
      self._loop = PlainLoop(
          self._experiment.model_spec, setting.learning_rate,
          self._lam if system == 'a_plain_tf_ditto' else -1.0,
          sandwich=system == 'a_plain_tf_aequa',
          jit_compile=system == 'a_plain_tf_xla')
    else:
      self._process = _process(system, self._experiment,
                               setting.learning_rate)
      self._state = self._process.set_model_weights(
          self._process.initialize(),
          self._experiment.model_spec.initial_weights(0))
    self._personal = {}

  def round(self, round_num: int) -> tuple[float, float]:
    """Seconds and CPU seconds of one round's training."""
    system, ids = self.system, self._ids
    datasets = sampling.client_datasets(self._experiment, ids, round_num,
                                        epochs=1)
    personal_data = (
        datasets if system != 'd_ditto_sequential' else
        sampling.client_datasets(self._experiment, ids, round_num, epochs=1,
                                 stream=1))
    start, start_cpu = time.perf_counter(), _cpu_seconds()
    if self._plain:
      self._loop.round(ids, datasets)
    elif system == 'd_ditto_fused':
      anchor = self._process.get_model_weights(self._state)
      output = self._process.personalize_and_next(self._state, [
          ditto.paired_input(ds, self._personal.get(cid, anchor), self._lam)
          for cid, ds in zip(ids, datasets)])
      self._personal = {cid: out['personal']
                        for cid, out in zip(ids, output.clients)}
      self._state = output.state
    else:
      if system.startswith('d_ditto'):
        anchor = self._process.get_model_weights(self._state)
        outputs = self._process.personalize(self._state, [
            ditto.personal_input(ds, self._personal.get(cid, anchor),
                                 self._lam)
            for cid, ds in zip(ids, personal_data)])
        self._personal = {cid: out['personal']
                          for cid, out in zip(ids, outputs)}
      if system == 'f_aequa_rewards_spread':
        datasets = [
            aequa_rewards.client_input(ds, width)
            for ds, width in zip(datasets, np.linspace(P_MIN, 1.0, len(ids)))]
      self._state = self._process.next(self._state, datasets).state
    seconds = time.perf_counter() - start
    cpu_seconds = _cpu_seconds() - start_cpu
    logging.info('%s round %d: %.2f s, %.2f CPU s', system, round_num,
                 seconds, cpu_seconds)
    return seconds, cpu_seconds


def main(argv):
  del argv
  log_filter.keep_info_logs_of_tff_fair_only()
  timing_settings.check_flags(_ROUNDS.value, _SYSTEMS.value, SYSTEMS)
  results = report.Results('round_time', {
      f.name: f.value for f in (_SETTING, _ROUNDS, _CLIENTS, _SYSTEMS,
                                _MODEL, _DATA_DIR, _OUTPUT)})
  rows = collections.OrderedDict()
  with local_runtime.local_context():
    systems = []
    for system in _SYSTEMS.value:
      if (system in SLIMMABLE_SYSTEMS
          and not timing_settings.has_slimmable_version(_model())):
        logging.info('Skipping %s: %s has no slimmable version.', system,
                     _model())
        continue
      systems.append(_TimedSystem(system))
    # Round by round, each system in turn (starting one further along each
    # round): a drift of the machine's speed falls on every system alike.
    times = {t.system: [] for t in systems}
    for round_num in range(1, _ROUNDS.value + 1):
      shift = round_num % len(systems)
      for timed in systems[shift:] + systems[:shift]:
        times[timed.system].append(timed.round(round_num))
    for system, measured in times.items():
      seconds, cpu_seconds = (np.array(t[1:]) for t in zip(*measured))
      rows[system] = (float(np.median(seconds)), float(seconds.min()),
                      float(seconds.max()), float(np.median(cpu_seconds)),
                      float(np.median(cpu_seconds / seconds)))
  median = {name: row[0] for name, row in rows.items()}
  median_cpu = {name: row[3] for name, row in rows.items()}
  lines = [f'{"system":<22}{"median s":>10}{"min":>8}{"max":>8}'
           f'{"CPU s":>8}{"cores":>7}']
  lines += [f'{name:<22}{m:>10.2f}{lo:>8.2f}{hi:>8.2f}{cpu:>8.2f}{cores:>7.2f}'
            for name, (m, lo, hi, cpu, cores) in rows.items()]
  lines.append(f'{"ratio":<22}{"of s":>10}{"of CPU s":>10}')
  ratios = []
  for label, num, den in (('b/a', 'b_tff_fedavg', 'a_plain_tf'),
                          ('a xla/a', 'a_plain_tf_xla', 'a_plain_tf'),
                          ('c/a', 'c_fedavg', 'a_plain_tf'),
                          # Ditto's arithmetic over FedAvg's, with no runtime.
                          ('a ditto/a', 'a_plain_tf_ditto', 'a_plain_tf'),
                          ('d/c', 'd_ditto_interleaved', 'c_fedavg'),
                          ('d/c sequential', 'd_ditto_sequential', 'c_fedavg'),
                          ('d/c fused', 'd_ditto_fused', 'c_fedavg'),
                          ('d/a', 'd_ditto_interleaved', 'a_plain_tf_ditto'),
                          ('d/a fused', 'd_ditto_fused', 'a_plain_tf_ditto'),
                          # Aequa's steps over FedAvg's, with no runtime.
                          ('a aequa/a', 'a_plain_tf_aequa', 'a_plain_tf'),
                          ('e/c', 'e_aequa', 'c_fedavg'),
                          ('e full width/c', 'e_aequa_full_width',
                           'c_fedavg'),
                          ('e/a aequa', 'e_aequa', 'a_plain_tf_aequa'),
                          ('f/c', 'f_aequa_rewards', 'c_fedavg'),
                          ('f spread/c', 'f_aequa_rewards_spread',
                           'c_fedavg'),
                          *((f'{g[2:]}/c', g, 'c_fedavg') for g in SYSTEMS
                            if g.startswith('g_'))):
    if num in median and den in median:
      lines.append(f'{label:<22}{median[num] / median[den]:>10.2f}'
                   f'{median_cpu[num] / median_cpu[den]:>10.2f}')
      ratios.append(dict(ratio=label, of_seconds=median[num] / median[den],
                         of_cpu_seconds=median_cpu[num] / median_cpu[den]))
  print(f'Setting {_SETTING.value}, model {_model()}, {_CLIENTS.value}'
        f' clients, rounds 2..'
        f'{_ROUNDS.value}:\n' + '\n'.join(lines))
  if _OUTPUT.value:
    os.makedirs(os.path.dirname(_OUTPUT.value) or '.', exist_ok=True)
    with open(_OUTPUT.value, 'w', newline='') as f:
      writer = csv.writer(f)
      writer.writerow(['system', 'median_seconds', 'min_seconds',
                       'max_seconds', 'median_cpu_seconds', 'median_cores'])
      writer.writerows((name, *row) for name, row in rows.items())
  results.table(
      'systems', f'Setting {_SETTING.value}, model {_model()},'
      f' {_CLIENTS.value} clients, rounds 2..{_ROUNDS.value}', (
          report.Column('system', 'system'),
          report.Column('median_seconds', 'median s', '.2f'),
          report.Column('min_seconds', 'min s', '.2f'),
          report.Column('max_seconds', 'max s', '.2f'),
          report.Column('median_cpu_seconds', 'CPU s', '.2f'),
          report.Column('median_cores', 'cores busy', '.2f')),
      [dict(system=name, median_seconds=m, min_seconds=lo, max_seconds=hi,
            median_cpu_seconds=cpu, median_cores=cores)
       for name, (m, lo, hi, cpu, cores) in rows.items()])
  results.table('ratios', 'Ratios of the medians', (
      report.Column('ratio', 'ratio'),
      report.Column('of_seconds', 'of seconds', '.2f'),
      report.Column('of_cpu_seconds', 'of CPU seconds', '.2f')), ratios)
  results.write(_RESULTS_FILE.value)


if __name__ == '__main__':
  app.run(main)
