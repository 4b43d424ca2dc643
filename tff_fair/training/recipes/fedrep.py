"""FedRep (Collins et al. 2021): a shared body, a head per client.

Each round every sampled client trains its head (`--personal_epochs`
passes over its training data with the body frozen; its optimizer
`--personal_optimizer` at `--personal_learning_rate`, 0: the client rate),
then the body (`--local_epochs` passes with the head frozen; the client
optimizer); only the body update is sent, aggregated (`--aggregator`) and
applied to the server's body (`--server_optimizer`)
(`tff_fair.algorithms.fedrep`). The head is the architecture's output
layer (`ModelSpec.head_variables`). Heads live in the run's `heads/` store,
versioned with the checkpoints, so a resumed run continues with the heads
of the checkpoint's round. A malicious client attacks the body update it
sends; its head is trained as any other.

Evaluation: only 'personalized', each client's head on the global body
(per round `test_*`, after the last round the kind 'personalized'). The
server model's head is the initial one, never trained (heads never reach
the server), so the global model is not a model any client uses; measured
on label-skewed digits it was near chance (mean accuracy 0.07-0.19 where
the personalized models reached 0.96-0.98), and it is not reported. A client never
sampled has no head of its own and is left out (`personal_clients_untrained`
counts them each round); FedRep would give it a head trained on the body
first, which this recipe does not do.

Outputs of its own: `heads/` and `fedrep_rounds.csv` (per round and sampled
client: the bytes it sent, the uncompressed size of its body update, and
the mean training loss of its head and body passes). Per round it releases
`head_loss_*` statistics and `client_work_bytes_sent`, the round's total.
"""

import dataclasses
from typing import Any

from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import fedrep as fedrep_lib
from tff_fair.evaluation import statistics
from tff_fair.models import parts
from tff_fair.training.recipes import own_models

HEADS_DIR = 'heads'
ROUND_LOG = 'fedrep_rounds.csv'
ROUND_LOG_FIELDS = ('round', 'client', 'malicious', 'bytes_sent',
                    'head_loss', 'body_loss')


@dataclasses.dataclass(frozen=True)
class Settings(own_models.PersonalTrainingSettings):
  """FedRep's settings: the head's training (`PersonalTrainingSettings`).

  The head's epochs are `personal_epochs` (PFLlib's default 1; the paper's
  CIFAR-10 setting 10), the body's the shared `local_epochs`.
  """


@dataclasses.dataclass
class _Round(own_models.RewardRound):
  """A FedRep round: each client's one epoch of data."""

  one_epoch: dict[str, Any] = dataclasses.field(default_factory=dict)


class FedRep(own_models.RewardedModels):
  """FedRep's shared body and per-client heads."""

  name = 'fedrep'
  Settings = Settings
  output_files = (ROUND_LOG,)
  client_state_dirs = (HEADS_DIR,)
  models_dir = HEADS_DIR
  # The server model's head is never trained: not a model to report.
  evaluates_global = False

  @classmethod
  def check_config(cls, config):
    return own_models.resolve_personal_rate(config)

  def __init__(self, context):
    super().__init__(context)
    self._log = context.round_log(ROUND_LOG, ROUND_LOG_FIELDS)

  def model_part(self):
    return parts.head(self.context.experiment.model_spec.head_variables)

  def build_rewarding_process(self):
    settings, config = self.settings, self.config
    return fedrep_lib.build_fedrep(
        self.model_fn, self.client_optimizer(), self.server_optimizer(),
        head_variables=self.model_part().head_variables,
        personal_optimizer_fn=settings.personal_optimizer_fn(),
        head_epochs=settings.personal_epochs, body_epochs=config.local_epochs,
        client_weighting=fed_avg.ClientWeighting.NUM_EXAMPLES,
        model_aggregator=self.model_aggregator(), client_context=True)

  def before_round(self, state, client_ids, round_num, datasets):
    # The process repeats one epoch of each client's data for the head and
    # for the body passes, so it gets one epoch (the first of the driver's
    # shuffles), not the driver's `local_epochs`.
    plan = super().before_round(state, client_ids, round_num, datasets)
    return _Round(**vars(plan), one_epoch=dict(zip(
        client_ids, self.context.client_datasets(client_ids, round_num,
                                                 epochs=1))))

  def client_input(self, plan, client_id, dataset, attack):
    del dataset  # `local_epochs` passes: the process makes its own.
    return super().client_input(plan, client_id, plan.one_epoch[client_id],
                                attack)

  def record_round(self, round_num, values):
    malicious = self.context.malicious
    rows = [{
        'round': round_num, 'client': cid,
        'malicious': int(cid in malicious),
        'bytes_sent': int(v['bytes_sent']),
        'head_loss': float(v['head_loss']),
        'body_loss': float(v['body_loss']),
    } for cid, v in values.items()]
    self._log.append(rows)
    return statistics.mean_min_max('head_loss',
                                   [row['head_loss'] for row in rows])
