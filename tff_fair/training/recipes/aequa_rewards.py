"""Training-time Aequa: widths earned by contributions, round by round.

Each round client i trains, receives and sends only the sub-network of its
maximum width p_i (`tff_fair.algorithms.aequa_rewards`: masked
aggregation). After the round its contribution is assessed
(`contribution_assessment`: CGSV's cosine of its update to the aggregate on
the common minimum-width sub-network, or to the others' aggregate, or its
data size), folded into a smoothed contribution
(`fairness.contribution.ContributionTracker`, weight `contribution_gamma`
on the past), and the reward mechanism maps the contributions to the next
round's widths (`proportional_widths`: the top contributor(s) get p_max, a
contribution of 0 gets p_min). Every client starts at p_max. The tracker
and the widths are kept per round with the checkpoints (`contributions/`),
so a resumed run continues exactly.

Outputs of its own: `aequa_rewards_rounds.csv` (per round and client: the
width it trained, its assessment and contribution, the width it earned for
the next round, the bytes it received and sent) and, after the last round,
'aequa_rewards' in the final tables: each client's test metrics with the
global model at the width it earned; and `width_accuracy.csv`: the global
model's accuracy at widths from p_min to p_max on the common held-out sets
(`RunContext.common_held_out`). A wider reward is an incentive only if it
is a better model; the widths beyond a client's are trained only by the
clients that earned them, so the run warns, naming the clients, when the
widest model scores below a narrower one there.
"""

import dataclasses
import math

from absl import logging
import numpy as np

from tff_fair.algorithms import aequa_rewards as aequa_rewards_lib
from tff_fair.evaluation import statistics
from tff_fair.fairness import contribution
from tff_fair.training import config as config_lib
from tff_fair.training import rewards as rewards_lib
from tff_fair.training.recipes import aequa
from tff_fair.training.recipes import recipe

ASSESSMENTS = ('cgsv', 'cgsv_leave_one_out', 'data_size')
STATE_DIR = 'contributions'
ROUND_LOG = 'aequa_rewards_rounds.csv'
# Widths of the width-accuracy curve, evenly from p_min to p_max.
CURVE_POINTS = 10
ROUND_LOG_FIELDS = ('round', 'client', 'malicious', 'width', 'assessment',
                    'contribution', 'next_width', 'bytes_received',
                    'bytes_sent')


@dataclasses.dataclass(frozen=True)
class Settings(aequa.WidthSettings):
  """Attributes (besides `aequa.WidthSettings`': every client trains p_min,
  the top contributor(s) get p_max; the widths sampled per step lie below
  the client's p_i):

    contribution_assessment: 'cgsv' (cosine of the client's update to the
      aggregate on the minimum-width sub-network), 'cgsv_leave_one_out' (to
      the aggregate of the other clients' updates: a free rider's own share
      no longer lifts its score, but an honest client whose data no one
      else resembles scores low too; `contribution.cosine_to_aggregate`)
      or 'data_size'.
    contribution_gamma: Weight of the past in the smoothed contribution,
      in [0, 1) (0: the latest assessment only). One round's cosine is
      noisy: at 0.5 a client with 50% label noise swung between widths 0.1
      and 0.8 from round to round (`benchmarks/aequa_rewards_fmnist.py`);
      0.9 averages about ten rounds (CGSV's own reputations use 0.95).
    reward_exponent: nu(q) = p_min + (p_max - p_min) q^exponent of the
      normalized contribution q; above 1 widens the gap.
  """

  contribution_assessment: str = config_lib.setting(
      'cgsv', 'how a round assesses each client: cgsv (the'
      ' cosine of its update to the aggregate on the minimum-width'
      ' sub-network), cgsv_leave_one_out (to the aggregate of the others:'
      ' sharper on free riders, harsher on honest clients with unusual'
      ' data) or data_size.', choices=ASSESSMENTS)
  contribution_gamma: float = config_lib.setting(
      0.9, 'weight of past rounds in each contribution, in'
      ' [0, 1) (0: the latest round only); one round\'s assessment is noisy,'
      ' 0.9 averages about ten.')
  reward_exponent: float = config_lib.setting(
      1.0, 'width = p_min + (p_max - p_min) * q^exponent of'
      ' the contribution q over the largest; above 1 widens the gap.')

  def __post_init__(self):
    super().__post_init__()
    config_lib.check_choice('contribution_assessment',
                            self.contribution_assessment, ASSESSMENTS)
    try:
      contribution.ContributionTracker(gamma=self.contribution_gamma)
    except ValueError as e:  # It names its own argument, gamma.
      raise config_lib.ConfigError(f'contribution_gamma: {e}') from e
    if not (math.isfinite(self.reward_exponent) and self.reward_exponent > 0):
      raise config_lib.ConfigError(
          'reward_exponent must be a finite number > 0, got'
          f' {self.reward_exponent}.')


@dataclasses.dataclass
class _Round(recipe.Round):
  """A round of training-time Aequa: the widths its clients train."""

  widths: dict[str, float] = dataclasses.field(default_factory=dict)


class AequaRewards(recipe.Recipe):
  """Slimmable FedAvg whose clients train the width their contribution earns."""

  name = 'aequa_rewards'
  Settings = Settings
  slimmable = True
  output_files = (ROUND_LOG, rewards_lib.CURVE_FILE)
  client_state_dirs = (STATE_DIR,)
  # The width-accuracy curve is measured on the common held-out sets.
  reads = {**{name: values for name, values in config_lib.READS_ALL.items()
              if name != 'aggregator'},
           'server_held_out_examples': None}
  ignored_because = {
      'aggregator': 'it averages each parameter over the clients whose'
                    ' sub-network holds it (its own aggregation), and each'
                    ' client\'s update on the minimum-width sub-network goes'
                    ' to the server unclipped and unnoised to assess its'
                    ' contribution (no DP aggregator could cover it)',
  }
  runs_on_several_workers = False

  def __init__(self, context):
    super().__init__(context)
    self._state = context.round_state_store(
        STATE_DIR, initial={'tracker': None, 'widths': {}})
    self._log = context.round_log(ROUND_LOG, ROUND_LOG_FIELDS)

  def build_process(self):
    settings = self.settings
    spec = self.context.experiment.model_spec
    return aequa_rewards_lib.build_aequa_rewards(
        self.model_fn, self.client_optimizer(), self.server_optimizer(),
        keras_model_fn=lambda: spec.build_keras(None), p_min=settings.p_min,
        p_max=settings.p_max, widths_per_step=settings.widths_per_step,
        client_context=True)

  def widths(self) -> dict[str, float]:
    """Each client's current maximum width (p_max until first assessed)."""
    earned = self._state.value['widths']
    return {cid: float(earned.get(cid, self.settings.p_max))
            for cid in self.context.client_ids}

  def _tracker(self) -> contribution.ContributionTracker:
    saved = self._state.value['tracker']
    gamma = self.settings.contribution_gamma
    if saved is None:
      return contribution.ContributionTracker(gamma=gamma)
    return contribution.ContributionTracker.from_json(saved, gamma)

  def before_round(self, state, client_ids, round_num, datasets):
    del datasets  # Only the widths are needed.
    widths = self.widths()
    return _Round(round_num, tuple(client_ids), state,
                  {cid: widths[cid] for cid in client_ids})

  def client_input(self, plan, client_id, dataset, attack):
    return aequa_rewards_lib.client_input(
        dataset, plan.widths[client_id], attack)

  def run_round(self, plan, process, state, client_inputs):
    del plan  # Every client's input carries its width.
    return process.next_with_client_outputs(state, client_inputs)

  def after_round(self, plan, output):
    """Assesses the round's clients, updates the widths, logs the round."""
    settings = self.settings
    context = self.context
    ids = plan.client_ids
    round_num = plan.number
    clients = list(output.clients)
    if settings.contribution_assessment == 'data_size':
      data = context.experiment.data
      assessment = contribution.data_size(
          {cid: data.num_examples(cid, 'train') for cid in ids})
    else:  # cgsv or cgsv_leave_one_out
      assessment = contribution.cosine_to_aggregate(
          {cid: np.asarray(c['min_width_update'])
           for cid, c in zip(ids, clients)},
          weights={cid: float(c['weight']) for cid, c in zip(ids, clients)},
          leave_one_out=(
              settings.contribution_assessment == 'cgsv_leave_one_out'))
    tracker = self._tracker()
    tracker.update(assessment)
    widths = contribution.proportional_widths(
        tracker.contributions, p_min=settings.p_min, p_max=settings.p_max,
        exponent=settings.reward_exponent)
    self._state.stage({'tracker': tracker.to_json(), 'widths': widths})
    rows = [{
        'round': round_num, 'client': cid,
        'malicious': int(cid in context.malicious),
        'width': plan.widths[cid], 'assessment': assessment[cid],
        'contribution': tracker.contributions[cid],
        'next_width': widths[cid],
        'bytes_received': int(c['bytes_received']),
        'bytes_sent': int(c['bytes_sent']),
    } for cid, c in zip(ids, clients)]
    self._log.append(rows)
    return {
        **statistics.mean_min_max('reward_width', [widths[c] for c in ids]),
        **statistics.mean_min_max(
            'contribution', [tracker.contributions[c] for c in ids]),
        **statistics.mean_min_max('bytes_sent',
                                  [row['bytes_sent'] for row in rows]),
    }

  def final_evaluations(self, state, global_weights):
    """'global' (full width) and 'aequa_rewards': each client at its width.

    Writes the width-accuracy curve and checks it (module docstring).
    """
    evaluations = super().final_evaluations(state, global_weights)
    widths = self.widths()
    evaluations.update(self.context.final_metrics(
        'aequa_rewards', global_weights, variant=rewards_lib.width_variants(
            self.context, self.context.experiment.model_spec.build_keras,
            widths)))
    self._check_width_curve(global_weights, widths)
    return evaluations

  def _check_width_curve(self, global_weights, widths):
    settings = self.settings
    held_out, test = self.context.common_held_out()
    build_keras = self.context.experiment.model_spec.build_keras
    grid = [float(w) for w in np.unique(np.round(np.linspace(
        settings.p_min, settings.p_max, CURVE_POINTS), 6))]
    curve = rewards_lib.width_accuracy_curve(build_keras, global_weights,
                                             grid, *held_out)
    rewards_lib.write_curve(
        self.config.output_dir, grid, curve,
        rewards_lib.width_accuracy_curve(build_keras, global_weights, grid,
                                         *test))
    shortfall = rewards_lib.widest_shortfall(grid, curve, len(held_out[1]))
    if shortfall is None:
      return
    best_width, best_accuracy = shortfall
    wider = sorted(cid for cid, w in widths.items() if w > best_width)
    shown = ', '.join(wider[:10]) + (', ...' if len(wider) > 10 else '')
    logging.warning(
        'A wider reward is not a better model here: on the common held-out'
        ' data (%d examples) the global model scores %.4f at width %.2f but'
        ' %.4f at p_max=%.2f (%s). The %d client(s) that earned more than'
        ' width %.2f (%s) may receive a worse model than that width: the'
        ' channels beyond it were trained only by the clients that earned'
        ' them.', len(held_out[1]), best_accuracy, best_width, curve[-1],
        grid[-1], rewards_lib.CURVE_FILE, len(wider), best_width,
        shown or 'none')
