"""Aequa: a slimmable global model, each client rewarded a width.

Training is FedAvg on the slimmable architecture, each local step at the
full width and `widths_per_step` widths drawn from [p_min, p_max]
(`tff_fair.algorithms.aequa`). After the last round
(`tff_fair.training.rewards`) the server measures contributions and the
width-accuracy curve on common held-out data, allocates each client a
width, and reports the rewarded models ('aequa'; 'standalone' too when
contributions are measured by standalone training).

Outputs of its own: width_accuracy.csv, aequa_allocation.csv,
aequa_contributions.json, aequa_fairness.json and TensorBoard's `aequa/`
run. The reward settings act after training, so a finished run may be
re-rewarded with other ones.
"""

import dataclasses
import math
import os
from typing import Any, Optional, Sequence

from tff_fair.algorithms import aequa as aequa_lib
from tff_fair.fairness import contribution
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import rewards as rewards_lib
from tff_fair.training import run_context
from tff_fair.training.recipes import recipe

ALLOCATION_SOLVERS = ('exact', 'annealing')


def contributions_file_setting(resumable: bool) -> Any:
  """The `contributions_file` field of a settings dataclass (Aequa's and
  IAFL's: one name, one meaning)."""
  return config_lib.setting(
      '', 'JSON {client_id: contribution} for every client, used instead of'
      ' measured contributions. Default: aequa trains each client alone and'
      " scores its model on the common held-out set the width-accuracy curve"
      " is measured on (the server's validation set with"
      " --server_held_out_examples, else all clients' validation splits"
      " pooled); iafl as --iafl_contribution says. An aequa run lists the"
      f' contributions it used in {rewards_lib.CONTRIBUTIONS_FILE}, which'
      ' this setting reads.',
      resumable=resumable)


def given_contributions(settings: Any, client_ids: Sequence[str]
                        ) -> Optional[dict[str, float]]:
  """The values of `settings.contributions_file`, checked against the
  run's clients; None when no file is given.

  Raises:
    config.ConfigError: Naming the file and what is wrong with it.
  """
  if not settings.contributions_file:
    return None
  return experiment_lib.load_client_values(settings.contributions_file,
                                           client_ids, 'contribution')


@dataclasses.dataclass(frozen=True)
class WidthSettings:
  """The slimmable training's widths (Aequa's, and its training-time rewards').

  Attributes:
    p_min / p_max: The width range (0 < p_min <= p_max <= 1).
    widths_per_step: Widths sampled per local step besides the top one.
  """

  p_min: float = config_lib.setting(0.1, 'smallest width.')
  p_max: float = config_lib.setting(1.0, 'largest sampled width.')
  widths_per_step: int = config_lib.setting(
      1, 'widths sampled per step besides the full one.')

  def __post_init__(self):
    try:
      contribution.check_width_range(self.p_min, self.p_max)
    except ValueError as e:
      raise config_lib.ConfigError(str(e)) from e
    if self.widths_per_step < 0:
      raise config_lib.ConfigError(
          f'widths_per_step must be >= 0, got {self.widths_per_step}.')

@dataclasses.dataclass(frozen=True)
class Settings(WidthSettings):
  """Attributes (besides `WidthSettings`'):

    width_step: Spacing of the width-accuracy curve's widths. The default
      0.01 is the benchmark's grid: a coarser grid leaves jumps in a steep
      curve that no allocation can bridge, so gains spread more.
      Allocation stays cheap; the curve costs two
      evaluations per width (held-out and reward test sets).
    allocation_solver: 'exact' (common-target sweep) or 'annealing'.
    ir_confidence: Confidence that IR holds beyond the held-out set
      (`tff_fair.training.rewards.ir_margins`).
    annealing_iterations: Iterations of the annealer (0: its default).
    contributions_file: JSON {client_id: contribution} for every client.
      '' (default): each client trains a model alone
      (`RunContext.standalone_epochs` epochs from the initial weights) and
      its contribution is that model's accuracy on the common held-out set
      the width-accuracy curve is measured on (the server's validation set
      with server_held_out_examples, else all clients' validation splits
      pooled, or their test splits pooled when there is no validation
      data); not on the client's own test split.
  """

  width_step: float = config_lib.setting(
      0.01, "spacing of the width-accuracy curve's widths, from"
      ' --p_min to --p_max; each client is rewarded one of them. The default'
      " 0.01 is the benchmark's: a coarser grid leaves jumps in a steep"
      ' curve that spread the gains. Allocation stays cheap; the'
      ' curve costs two held-out evaluations per width (91 widths: minutes'
      ' on 2 cores). May change when resuming: a finished run re-allocates'
      ' without retraining the global model.', resumable=True)
  allocation_solver: str = config_lib.setting(
      'exact', 'width allocation.', choices=ALLOCATION_SOLVERS,
      resumable=True)
  annealing_iterations: int = config_lib.setting(
      0, 'annealer iterations (0: its default).', resumable=True)
  ir_confidence: float = config_lib.setting(
      0.95, 'confidence, in [0.5, 1), that each reward is at least its'
      " client's contribution on data the width was not chosen on: a"
      " width's held-out accuracy must clear the contribution by the"
      " held-out set's sampling noise at this confidence. 0.5: no margin,"
      " IR on the held-out set only (the paper's rule): on unseen data a"
      " reward can then fall short of the client's standalone accuracy.",
      resumable=True)
  contributions_file: str = contributions_file_setting(resumable=True)

  def __post_init__(self):
    super().__post_init__()
    config_lib.check_choice('allocation_solver', self.allocation_solver,
                            ALLOCATION_SOLVERS)
    if not 0 < self.width_step <= 1:
      raise config_lib.ConfigError(
          f'width_step must be in (0, 1], got {self.width_step}.')
    if not 0.5 <= self.ir_confidence < 1:
      raise config_lib.ConfigError(
          f'ir_confidence must lie in [0.5, 1), got {self.ir_confidence}:'
          ' 0.5 for no IR margin, e.g. 0.95 for a one-sided 95% one.')
    if self.annealing_iterations < 0:
      raise config_lib.ConfigError(
          'annealing_iterations must be >= 0, got'
          f' {self.annealing_iterations}.')

  def width_grid(self) -> tuple[float, ...]:
    """Widths of the width-accuracy curve: p_min, p_min + step, ..., p_max."""
    count = int(math.floor((self.p_max - self.p_min) / self.width_step + 1e-9))
    grid = [round(self.p_min + i * self.width_step, 10)
            for i in range(count + 1)]
    if grid[-1] < self.p_max - 1e-9:
      grid.append(self.p_max)
    return tuple(grid)

class Aequa(recipe.Recipe):
  """Slimmable FedAvg, then contributions, width allocation and rewards."""

  name = 'aequa'
  Settings = Settings
  slimmable = True
  # Contributions and the width-accuracy curve use the common held-out sets.
  reads = {**config_lib.READS_ALL, 'server_held_out_examples': None}
  output_files = (rewards_lib.CURVE_FILE, 'aequa_allocation.csv',
                  rewards_lib.CONTRIBUTIONS_FILE, 'aequa_fairness.json')

  @classmethod
  def check_client_files(cls, config, client_ids):
    given_contributions(config.settings, client_ids)

  def build_process(self):
    settings = self.settings
    return aequa_lib.build_aequa(
        self.model_fn, self.client_optimizer(), self.server_optimizer(),
        model_aggregator=self.model_aggregator(), p_min=settings.p_min,
        p_max=settings.p_max, widths_per_step=settings.widths_per_step,
        client_context=True)

  def final_evaluations(self, state, global_weights):
    """'global', the contributions' 'standalone' models and 'aequa'.

    Contributions and the width-accuracy curve are measured on the same
    common held-out set, so gains a_i - c_i compare like with like: a skewed
    client's standalone model is judged on the federation's distribution, as
    the global model is. With server held-out sets
    (`server_held_out_examples`) that is the server's validation set and the
    rewarded models are measured on the server's test set. Without them it
    is all clients' validation splits pooled (their test splits when there
    is none), and the rewarded models are measured on the pooled test
    splits. Each rewarded model is also measured on its client's own test
    split.
    """
    config = self.config
    settings = self.settings
    context = self.context
    data = context.experiment.data
    evaluations = super().final_evaluations(state, global_weights)
    held_out, reward_test = context.common_held_out()
    test_contributions = None
    contributions = given_contributions(settings, data.client_ids)
    if contributions is None:
      models, contributions = context.standalone_contributions(held_out)
      standalone = context.final_metrics(
          'standalone', models, variant=experiment_lib.PLAIN)
      evaluations.update(standalone)
      # The common test set is `reward_test`: measured already when the
      # run evaluates on it.
      on_reward_test = standalone.get(
          'standalone' + run_context.COMMON_TEST) or context.evaluate(
              models, common=True, variant=experiment_lib.PLAIN)
      test_contributions = {cid: m.accuracy
                            for cid, m in on_reward_test.items()}
    rewards = rewards_lib.assign_rewards(
        context.experiment.model_spec.build_keras, global_weights,
        settings.width_grid(), held_out, contributions, reward_test,
        test_contributions=test_contributions,
        ir_confidence=settings.ir_confidence,
        solver=settings.allocation_solver,
        annealing_iterations=settings.annealing_iterations, seed=config.seed)
    evaluations.update(context.final_metrics(
        'aequa', global_weights, variant=rewards_lib.width_variants(
            context, context.experiment.model_spec.build_keras,
            rewards_lib.allocated_widths(rewards))))
    rewards_lib.write_tables(rewards, evaluations['aequa'], config.output_dir)
    rewards_lib.write_tensorboard(
        rewards, os.path.join(config.output_dir, 'tensorboard', 'aequa'))
    return evaluations
