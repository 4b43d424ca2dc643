"""Aequa's post-training rewards: curve, contributions, widths, fairness.

After federated slimmable training the server

1. measures the global model's width-accuracy curve on common held-out
   data (the server's held-out validation set when the run has one;
   otherwise the clients' validation splits pooled, or their test splits
   when there is no validation data), at `RunConfig.width_grid()`;
2. takes each client's contribution c_i: values the user supplies, or the
   accuracy of the client's standalone model on the same held-out data (the
   paper's surrogate, measured where the curve is, so that a_i - c_i
   compares like with like);
3. allocates one width per client with `tff_fair.fairness.allocation`
   (IR, low variance and high mean of the gains a_i - c_i, a_i read off
   the curve). IR asks a_i >= c_i + m_i: the margin m_i (`ir_margins`) is
   the held-out set's sampling noise at the chosen confidence, so that IR
   holds on data the width was not chosen on, not only on the held-out
   set (where the narrowest width that clears c_i is often one the noise
   flattered);
4. gives each client the global model at its width and measures it on a
   second common set (the server's held-out test set, or the clients' test
   splits pooled): the accuracy the fairness report compares with the
   contributions measured on that same set (the standalone models'
   accuracy there; supplied contributions as given). It is disjoint from
   the first unless the clients have no validation splits; measuring where
   the width was chosen would reward the curve's noise. The recipe also
   measures each model on its client's own test split (`write_tables`
   reports it beside).
"""

import csv
import dataclasses
import json
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Optional

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair import files
from tff_fair.evaluation import per_client
from tff_fair.fairness import allocation as allocation_lib
from tff_fair.fairness import metrics as fairness_metrics
from tff_fair.models import slimmable

# The width-accuracy curve's table.
CURVE_FILE = 'width_accuracy.csv'
# The contributions the allocation used, in the form --contributions_file
# reads: another run (an IAFL run, a re-reward) can take them as given.
CONTRIBUTIONS_FILE = 'aequa_contributions.json'


@dataclasses.dataclass(frozen=True)
class Rewards:
  """Attributes:

    widths: The curve's widths.
    curve: Held-out accuracy of the global model at each width.
    contributions: Client id -> c_i.
    allocation: The solver's result (clients in `client_ids` order).
    client_ids: Clients, in the allocation's order.
    test_curve: Accuracy of the global model at each width on the reward
      test set.
    ir_confidence: The confidence the margins were set for.
    ir_margins: (N,) how far each client's held-out reward had to clear
      its contribution (`ir_margins`).
    test_contributions: Client id -> the contribution the report compares
      with: measured on the reward test set where the caller measured it,
      else `contributions`.
    report: Fairness of the rewarded models' reward-test accuracies against
      `test_contributions`.
  """

  widths: tuple[float, ...]
  curve: np.ndarray
  contributions: Mapping[str, float]
  allocation: allocation_lib.Allocation
  client_ids: tuple[str, ...]
  test_curve: np.ndarray
  ir_confidence: float
  ir_margins: np.ndarray
  test_contributions: Mapping[str, float]
  report: fairness_metrics.FairnessReport


def ir_margins(contributions: np.ndarray, held_out_size: int,
               confidence: float, contributions_measured: bool) -> np.ndarray:
  """Margins m_i such that a_i >= c_i + m_i holds beyond the held-out set.

  An accuracy p measured on n examples has standard error
  sqrt(p (1 - p) / n). The curve's accuracy a_i is such an estimate, and so
  is c_i when it was measured on the same held-out set (standalone
  accuracy); near the threshold a_i ~ c_i, so their difference has
  standard error sqrt(k c_i (1 - c_i) / n), k = 2 for two estimates and
  1 for a curve against a given contribution. The margin is z of those,
  z the standard normal quantile of `confidence` (one-sided): 0.5 gives
  z = 0, IR on the held-out set only (the paper's rule).

  Args:
    contributions: (N,) c_i, accuracies in [0, 1] when measured.
    held_out_size: Examples behind each held-out accuracy.
    confidence: In [0.5, 1).
    contributions_measured: Whether c_i were measured on the held-out set
      (else they are taken as exact).

  Returns:
    (N,) margins >= 0.
  """
  if not 0.5 <= confidence < 1:
    raise ValueError(f'confidence must lie in [0.5, 1); got {confidence}.')
  if held_out_size < 1:
    raise ValueError(f'held_out_size must be >= 1, got {held_out_size}.')
  z = statistics.NormalDist().inv_cdf(confidence)
  p = np.clip(np.asarray(contributions, np.float64), 0.0, 1.0)
  estimates = 2 if contributions_measured else 1
  return z * np.sqrt(estimates * p * (1 - p) / held_out_size)


def width_evaluator(build_keras, width: float) -> per_client.ClientEvaluator:
  """An evaluator running a slimmable model at `width`."""
  return per_client.ClientEvaluator(
      build_keras, input_fn=lambda x: slimmable.slimmable_inputs(x, width))


def width_variants(context, build_keras,
                   widths: Mapping[str, float]) -> dict[str, str]:
  """Client -> its model variant: the slimmable model at the client's width.

  Registers each width's evaluator with `context`
  (`RunContext.add_variant`), so a run evaluates each client's reward at
  its width, clients of one width together.
  """
  variants = {}
  for cid, width in widths.items():
    variant = f'width={float(width)!r}'
    if variant not in variants.values():
      context.add_variant(variant, width_evaluator(build_keras, width))
    variants[cid] = variant
  return variants


def width_accuracy_curve(
    build_keras, weights: tff.learning.models.ModelWeights,
    widths: Sequence[float], x: np.ndarray, y: np.ndarray,
) -> np.ndarray:
  """Accuracy of `weights` at each width on `(x, y)`."""
  return np.array([
      width_evaluator(build_keras, w).evaluate(weights, x, y).accuracy
      for w in widths])


def assign_rewards(
    build_keras,
    weights: tff.learning.models.ModelWeights,
    widths: Sequence[float],
    held_out: tuple[np.ndarray, np.ndarray],
    contributions: Mapping[str, float],
    reward_test: tuple[np.ndarray, np.ndarray],
    *,
    test_contributions: Optional[Mapping[str, float]] = None,
    ir_confidence: float = 0.5,
    solver: str = 'exact',
    annealing_iterations: int = 0,
    seed: int = 0,
) -> Rewards:
  """Runs steps 1, 3 and 4 of the module docstring.

  Args:
    build_keras: The slimmable architecture's builder.
    weights: The trained global model.
    widths: Curve widths, increasing, in (0, 1].
    held_out: Pooled held-out `(x, y)` for the curve.
    contributions: Client id -> c_i for every client to reward.
    reward_test: Common `(x, y)` the rewarded models are measured on
      (step 4).
    test_contributions: Client id -> c_i measured on `reward_test`, when
      the contributions are accuracies measured on `held_out` (standalone
      models); `None` when they were supplied, and are taken as exact.
    ir_confidence: Confidence in [0.5, 1) that IR holds beyond the
      held-out set (`ir_margins`); 0.5: on the held-out set only.
    solver: 'exact' or 'annealing'.
    annealing_iterations: Annealer iterations (0: its default).
    seed: The annealer's seed.

  Returns:
    The `Rewards`.
  """
  curve = width_accuracy_curve(build_keras, weights, widths, *held_out)
  client_ids = tuple(contributions)
  c = np.array([contributions[cid] for cid in client_ids])
  margins = ir_margins(c, len(held_out[1]), ir_confidence,
                       contributions_measured=test_contributions is not None)
  options = {}
  if solver == 'annealing':
    options = dict(seed=seed)
    if annealing_iterations:
      options['iterations'] = annealing_iterations
  try:
    allocation = allocation_lib.allocate(c, np.asarray(widths), curve,
                                         solver=solver, ir_margin=margins,
                                         **options)
  except allocation_lib.NoAdmissibleAllocation as e:
    # The global model is worse than what most clients reach alone (e.g.
    # too few rounds): no allocation has a positive mean gain. Documented
    # rule: everyone receives the most accurate width; the report then
    # shows the negative gains.
    logging.warning('%s Every client receives the most accurate width.', e)
    allocation = _best_width_for_all(c, np.asarray(widths), curve)
  test_curve = width_accuracy_curve(build_keras, weights, widths,
                                    *reward_test)
  test_contributions = dict(test_contributions or contributions)
  report = fairness_metrics.fairness_report(
      [test_contributions[cid] for cid in client_ids],
      test_curve[np.asarray(allocation.level)])
  return Rewards(tuple(widths), curve, dict(contributions), allocation,
                 client_ids, test_curve, ir_confidence, margins,
                 test_contributions, report)


def _best_width_for_all(
    contributions: np.ndarray, widths: np.ndarray, curve: np.ndarray
) -> allocation_lib.Allocation:
  best = int(np.flatnonzero(curve == curve.max())[0])  # The narrowest.
  n = contributions.size
  gain = curve[best] - contributions
  return allocation_lib.Allocation(
      level=np.full(n, best), width=np.full(n, widths[best]),
      accuracy=np.full(n, curve[best]), gain=gain, cost=float('inf'),
      mean_gain=float(gain.mean()), gain_variance=float(gain.var()),
      ir_infeasible=tuple(int(i) for i in np.flatnonzero(gain < 0)),
      solver='best_width_for_all', cost_name='none')


def write_tensorboard(rewards: Rewards, logdir: str) -> None:
  """The allocation as TensorBoard scalars, to look at rather than read.

  `aequa/width_accuracy_{held_out,test}` is the width-accuracy curve, its
  step the width in percent. `aequa/{contribution,width,reward_accuracy}
  _by_rank` put each client's contribution beside its reward, clients
  ordered by contribution (step 0: the smallest); reward_accuracy is the
  rewarded model's accuracy on the reward test set.

  Args:
    rewards: The result of `assign_rewards`.
    logdir: The TensorBoard run folder to write.
  """
  order = sorted(range(len(rewards.client_ids)),
                 key=lambda i: rewards.contributions[rewards.client_ids[i]])
  writer = tf.summary.create_file_writer(logdir)
  with writer.as_default():
    for width, held_out, test in zip(rewards.widths, rewards.curve,
                                     rewards.test_curve):
      step = int(round(width * 100))
      tf.summary.scalar('aequa/width_accuracy_held_out', held_out, step=step)
      tf.summary.scalar('aequa/width_accuracy_test', test, step=step)
    for rank, i in enumerate(order):
      cid = rewards.client_ids[i]
      tf.summary.scalar('aequa/contribution_by_rank',
                        rewards.contributions[cid], step=rank)
      tf.summary.scalar('aequa/width_by_rank',
                        rewards.allocation.width[i], step=rank)
      tf.summary.scalar(
          'aequa/reward_accuracy_by_rank',
          rewards.test_curve[rewards.allocation.level[i]], step=rank)
  writer.close()


def allocated_widths(rewards: Rewards) -> dict[str, float]:
  """Client id -> the width it was allocated."""
  return {cid: float(w)
          for cid, w in zip(rewards.client_ids, rewards.allocation.width)}


def widest_shortfall(
    widths: Sequence[float], accuracies: Sequence[float], num_examples: int,
    min_gap: float = 0.01) -> tuple[float, float] | None:
  """Whether the widest model scores clearly below a narrower one.

  A width reward is an incentive only if a wider sub-network is a better
  model. It need not be when the widths beyond some point were trained by
  few clients (training-time Aequa: only those whose earned width covers
  them), so the run checks its curve.

  Args:
    widths: Increasing widths.
    accuracies: The model's accuracy at each, on `num_examples` examples.
    num_examples: Examples behind each accuracy.
    min_gap: The smallest shortfall reported. A larger one must also
      exceed two standard errors of the best accuracy on `num_examples`,
      so a small evaluation set's noise is not reported.

  Returns:
    (the best width, its accuracy) when the widest one's accuracy falls
    short of it by more than that; else None.
  """
  accuracies = np.asarray(accuracies, float)
  if len(widths) != accuracies.size or not accuracies.size:
    raise ValueError('One accuracy per width, at least one width.')
  if num_examples < 1:
    raise ValueError(f'num_examples must be >= 1, got {num_examples}.')
  best = int(np.argmax(accuracies))
  top = accuracies[best]
  gap = max(min_gap, 2 * np.sqrt(top * (1 - top) / num_examples))
  if accuracies[-1] < top - gap:
    return float(widths[best]), float(top)
  return None


def write_curve(output_dir: str, widths: Sequence[float],
                held_out: Sequence[float], test: Sequence[float]) -> None:
  """`CURVE_FILE`: the global model's accuracy at each width."""
  def write(f):
    writer = csv.writer(f)
    writer.writerow(['width', 'held_out_accuracy', 'test_accuracy'])
    writer.writerows(zip(widths, np.asarray(held_out).tolist(),
                         np.asarray(test).tolist()))

  files.write_atomically(os.path.join(output_dir, CURVE_FILE), write)


def write_tables(
    rewards: Rewards, own_test: Mapping[str, per_client.ClientMetrics],
    output_dir: str) -> None:
  """width_accuracy.csv, aequa_allocation.csv, aequa_contributions.json
  and aequa_fairness.json.

  Args:
    rewards: The result of `assign_rewards`.
    own_test: Client id -> metrics of its rewarded model on its own test
      split (the column `own_test_accuracy`).
    output_dir: Where the files go.
  """
  write_curve(output_dir, rewards.widths, rewards.curve, rewards.test_curve)
  rows = []
  for i, cid in enumerate(rewards.client_ids):
    accuracy = float(rewards.test_curve[rewards.allocation.level[i]])
    test_contribution = rewards.test_contributions[cid]
    rows.append(dict(
        client=cid, contribution=rewards.contributions[cid],
        ir_margin=float(rewards.ir_margins[i]),
        width=float(rewards.allocation.width[i]),
        held_out_accuracy=float(rewards.allocation.accuracy[i]),
        test_contribution=test_contribution,
        accuracy=accuracy, gain=accuracy - test_contribution,
        own_test_accuracy=own_test[cid].accuracy))
  def write_rows(f):
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)

  files.write_atomically(os.path.join(output_dir, 'aequa_allocation.csv'),
                         write_rows)
  contributions = {cid: float(rewards.contributions[cid])
                   for cid in rewards.client_ids}
  files.write_atomically(os.path.join(output_dir, CONTRIBUTIONS_FILE),
                         lambda f: json.dump(contributions, f, indent=1))
  fairness = dict(
      rewards.report.as_dict(),
      ir_confidence=rewards.ir_confidence,
      allocation_cost=rewards.allocation.cost,
      allocation_solver=rewards.allocation.solver,
      ir_infeasible=[rewards.client_ids[i]
                     for i in rewards.allocation.ir_infeasible])
  files.write_atomically(os.path.join(output_dir, 'aequa_fairness.json'),
                         lambda f: json.dump(fairness, f, indent=2))
  lines = [f'{"client":<24}{"contrib.":>9}{"margin":>8}{"width":>7}'
           f'{"test contrib.":>14}{"accuracy":>10}{"gain":>8}'
           f'{"own test":>10}']
  for r in rows:
    lines.append(f'{r["client"]:<24}{r["contribution"]:>9.4f}'
                 f'{r["ir_margin"]:>8.4f}{r["width"]:>7.2f}'
                 f'{r["test_contribution"]:>14.4f}{r["accuracy"]:>10.4f}'
                 f'{r["gain"]:>8.4f}{r["own_test_accuracy"]:>10.4f}')
  report = rewards.report
  lines.append(
      f'Pearson(accuracy, contribution)={report.pearson:.4f}  mean gain='
      f'{report.mean_gain:.4f}  gain spread={report.gain_spread:.4f}  IR'
      f' violations={report.ir_violations}')
  logging.info('Aequa rewards:\n%s', '\n'.join(lines))
