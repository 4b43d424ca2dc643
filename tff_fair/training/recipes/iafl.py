"""IAFL (Wu et al. 2024): each client shares in others' updates by contribution.

A baseline of Aequa (`tff_fair.algorithms.iafl`). Every client trains its
own model; client i receives its own update mixed with those of
k_i = ceil(gamma_i^(1 - kappa) (n - 1)) other clients of the round chosen
at random, gamma_i its contribution over the largest, and with probability
`iafl_reset_probability` its model is reset to the server model. The
server model is FedAvg's.

Contributions (`iafl_contribution`): 'standalone' (default) measures each
client's model trained alone on common held-out data before the first
round, as Aequa does after training (`RunContext.standalone_contributions`),
and keeps them with the checkpoints (`iafl_contributions/`); 'data_size'
uses the client's training examples. `contributions_file` gives them
instead (e.g. those an Aequa run of the same clients measured: the same
standalone models, not trained twice).

Outputs of its own: `client_models/`, `iafl_contributions/` and
`iafl_rounds.csv` (per round and sampled client: its contribution, how many
others' updates it received and whether it was reset). After the last
round 'personalized' holds each client's test metrics with its own model.
"""

import dataclasses
import math

import numpy as np

from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import iafl as iafl_lib
from tff_fair.evaluation import statistics
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import aequa
from tff_fair.training.recipes import own_models

CONTRIBUTIONS = ('standalone', 'data_size')
CONTRIBUTIONS_DIR = 'iafl_contributions'
ROUND_LOG = 'iafl_rounds.csv'
ROUND_LOG_FIELDS = ('round', 'client', 'malicious', 'contribution',
                    'others_shared', 'reset')


@dataclasses.dataclass(frozen=True)
class Settings:
  """Attributes:

    iafl_kappa: Sharing level in [0, 1] (1: every client receives every
      other update of the round; 0: in proportion to its contribution).
    iafl_reset_probability: Probability that a client's model is reset to
      the server model after a round, in [0, 1].
    iafl_contribution: 'standalone' (each client's model trained alone,
      judged on common held-out data) or 'data_size'.
    contributions_file: JSON {client_id: contribution} for every client,
      instead of `iafl_contribution`'s; '' (default): measured.
  """

  iafl_kappa: float = config_lib.setting(
      0.5, 'sharing level in [0, 1]: a client receives the updates of'
      ' ceil(gamma^(1 - kappa) * (n - 1)) others, gamma its contribution'
      ' over the largest.')
  iafl_reset_probability: float = config_lib.setting(
      0.0, "probability that a client's model is reset to the server"
      ' model after a round.')
  iafl_contribution: str = config_lib.setting(
      'standalone', "each client's contribution: standalone (its model"
      ' trained alone, judged on common held-out data before round 1) or'
      ' data_size.', choices=CONTRIBUTIONS)
  # Read before round 1 and kept: a resumed run cannot change them.
  contributions_file: str = aequa.contributions_file_setting(resumable=False)

  def __post_init__(self):
    config_lib.check_choice('iafl_contribution', self.iafl_contribution,
                            CONTRIBUTIONS)
    if self.contributions_file and self.iafl_contribution != 'standalone':
      raise config_lib.ConfigError(
          f'--iafl_contribution={self.iafl_contribution} and'
          ' --contributions_file both give the contributions: give one of'
          ' them.')
    for name in ('iafl_kappa', 'iafl_reset_probability'):
      value = getattr(self, name)
      if not (math.isfinite(value) and 0 <= value <= 1):
        raise config_lib.ConfigError(
            f'{name} must be in [0, 1], got {value}.')


def _measures_standalone(settings: Settings) -> bool:
  """Whether the run trains every client alone to measure contributions."""
  return (settings.iafl_contribution == 'standalone'
          and not settings.contributions_file)


class Iafl(own_models.RewardedModels):
  """IAFL's contribution-proportional sharing; a model per client."""

  name = 'iafl'
  Settings = Settings
  # Standalone contributions are judged on the common held-out sets.
  reads = {**config_lib.READS_ALL, 'aggregator': ('mean', 'robust'),
           'server_held_out_examples': None}
  ignored_because = {
      'aggregator': "IAFL's server also gathers every client's raw update"
                    " to mix it into the others' models (the paper's rule):"
                    ' a compressed or private aggregate of the server model'
                    ' would leave those updates as they are (with the DP'
                    ' aggregator they would leak, unclipped and unnoised, to'
                    ' other clients)',
      'server_held_out_examples': 'with --iafl_contribution=data_size or'
                                  ' --contributions_file it measures no'
                                  ' model on common held-out data unless'
                                  ' --common_test_evaluation is given',
  }
  output_files = (ROUND_LOG,)
  client_state_dirs = (own_models.REWARDED_MODELS_DIR, CONTRIBUTIONS_DIR)
  models_dir = own_models.REWARDED_MODELS_DIR

  @classmethod
  def settings_read(cls, config):
    reads = dict(super().settings_read(config))
    if (not _measures_standalone(config.settings)
        and not config.common_test_evaluation):
      del reads['server_held_out_examples']
    return reads

  @classmethod
  def check_client_files(cls, config, client_ids):
    aequa.given_contributions(config.settings, client_ids)

  def __init__(self, context):
    super().__init__(context)
    self._log = context.round_log(ROUND_LOG, ROUND_LOG_FIELDS)
    self._contributions = context.round_state_store(CONTRIBUTIONS_DIR)

  def build_rewarding_process(self):
    settings = self.settings
    return iafl_lib.build_iafl(
        self.model_fn, self.client_optimizer(), self.server_optimizer(),
        model_aggregator=self.model_aggregator(),
        num_clients=len(self.context.client_ids), kappa=settings.iafl_kappa,
        reset_probability=settings.iafl_reset_probability,
        seed=self.config.seed, contribution_input=True,
        client_weighting=fed_avg.ClientWeighting.NUM_EXAMPLES,
        client_context=True)

  def contributions(self) -> dict[str, float]:
    """Each client's contribution p_i, measured or read once (then kept)."""
    if self._contributions.value is None:
      given = aequa.given_contributions(self.settings, self.context.client_ids)
      self._contributions.stage(given if given is not None
                                else self._measure_contributions())
    return self._contributions.value

  def _measure_contributions(self) -> dict[str, float]:
    context = self.context
    if self.settings.iafl_contribution == 'standalone':
      _, measured = context.standalone_contributions(
          context.common_held_out()[0])
      return measured
    data = context.experiment.data
    return {cid: float(data.num_examples(cid, 'train'))
            for cid in context.client_ids}

  def extra_input(self, client_id):
    return {'contribution': np.float32(self.contributions()[client_id])}

  def record_round(self, round_num, values):
    contributions = self.contributions()
    rows = [{
        'round': round_num, 'client': cid,
        'malicious': int(cid in self.context.malicious),
        'contribution': contributions[cid],
        'others_shared': int(v['k']), 'reset': int(bool(v['reset'])),
    } for cid, v in values.items()]
    self._log.append(rows)
    return statistics.mean_min_max('others_shared',
                                   [row['others_shared'] for row in rows])
