"""CGSV (Xu et al. 2021): each client rewarded a share of the aggregate.

A baseline of Aequa (`tff_fair.algorithms.cgsv`). Every client trains its
own model; the server aggregates the normalized updates weighted by the
clients' reputations (the cosine of each update to the aggregate, smoothed
over rounds), and each client receives the aggregate sparsified to its
reward share. Reputations are server state, so the checkpoints hold them;
the clients' models live in the run's `client_models/` store.

Outputs of its own: `client_models/` and `cgsv_rounds.csv` (per round and
sampled client: its cosine phi, its reputation after the round and its
reward share). After the last round 'personalized' holds each client's
test metrics with its own (rewarded) model.
"""

import dataclasses
import math

from tff_fair.algorithms import cgsv as cgsv_lib
from tff_fair.algorithms import fed_avg
from tff_fair.evaluation import statistics
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import own_models

ROUND_LOG = 'cgsv_rounds.csv'
ROUND_LOG_FIELDS = ('round', 'client', 'malicious', 'phi', 'reputation',
                    'reward_share')


@dataclasses.dataclass(frozen=True)
class Settings:
  """Attributes (the defaults are CGSV's):

    cgsv_alpha: Weight of the past reputation, in [0, 1].
    cgsv_beta: Reward steepness, > 0: shares are tanh(beta r) over the
      largest; a larger beta evens them out.
    cgsv_norm: The norm Gamma every update is scaled to, > 0.
  """

  cgsv_alpha: float = config_lib.setting(
      0.95, 'weight of the past reputation, in [0, 1].')
  cgsv_beta: float = config_lib.setting(
      1.0, 'reward steepness > 0: share = tanh(beta * r) / max;'
      ' larger evens the shares out.')
  cgsv_norm: float = config_lib.setting(
      0.5, 'the norm every client update is scaled to (Gamma), > 0.')

  def __post_init__(self):
    if not (math.isfinite(self.cgsv_alpha) and 0 <= self.cgsv_alpha <= 1):
      raise config_lib.ConfigError(
          f'cgsv_alpha must be in [0, 1], got {self.cgsv_alpha}.')
    for name in ('cgsv_beta', 'cgsv_norm'):
      value = getattr(self, name)
      if not (math.isfinite(value) and value > 0):
        raise config_lib.ConfigError(
            f'{name} must be a finite number > 0, got {value}.')


class Cgsv(own_models.RewardedModels):
  """CGSV's reputations and sparsified rewards; a model per client."""

  name = 'cgsv'
  Settings = Settings
  # The aggregator computes the reputation-weighted mean: a weighted one.
  reads = {**config_lib.READS_ALL,
           'aggregator': ('mean', 'robust', 'compression')}
  ignored_because = {
      'aggregator': 'the DP aggregator weighs every client equally where'
                    ' CGSV weighs each update by its reputation (the'
                    ' paper\'s rule), and each client\'s reputation and'
                    ' reward, computed from its unclipped, unnoised update,'
                    ' would leak what the private aggregate hides',
  }
  output_files = (ROUND_LOG,)
  client_state_dirs = (own_models.REWARDED_MODELS_DIR,)
  models_dir = own_models.REWARDED_MODELS_DIR

  def __init__(self, context):
    super().__init__(context)
    self._log = context.round_log(ROUND_LOG, ROUND_LOG_FIELDS)

  def build_rewarding_process(self):
    settings = self.settings
    return cgsv_lib.build_cgsv(
        self.model_fn, self.client_optimizer(), self.server_optimizer(),
        model_aggregator=self.model_aggregator(),
        num_clients=len(self.context.client_ids), alpha=settings.cgsv_alpha,
        beta=settings.cgsv_beta, norm_gamma=settings.cgsv_norm,
        client_weighting=fed_avg.ClientWeighting.NUM_EXAMPLES,
        client_context=True)

  def record_round(self, round_num, values):
    malicious = self.context.malicious
    rows = [{
        'round': round_num, 'client': cid,
        'malicious': int(cid in malicious), 'phi': float(v['phi']),
        'reputation': float(v['reputation']),
        'reward_share': float(v['reward']),
    } for cid, v in values.items()]
    self._log.append(rows)
    return {
        **statistics.mean_min_max('reputation',
                                  [row['reputation'] for row in rows]),
        **statistics.mean_min_max('reward_share',
                                  [row['reward_share'] for row in rows]),
    }
