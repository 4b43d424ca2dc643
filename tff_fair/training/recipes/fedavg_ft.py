"""FedAvg + fine-tuning: FedAvg, then each client fine-tunes the final model.

The personalization baseline of the Ditto paper: after the last round every
client trains the global model alone for `finetune_epochs` epochs on its
training split and is measured with the result ('fine_tuned').
"""

import dataclasses

from absl import logging

from tff_fair.training import config as config_lib
from tff_fair.training.recipes import fedavg


@dataclasses.dataclass(frozen=True)
class Settings:
  """Attributes:

    finetune_epochs: Local epochs of the fine-tuning.
  """

  finetune_epochs: int = config_lib.setting(
      1, 'local fine-tuning epochs.')

  def __post_init__(self):
    if self.finetune_epochs < 1:
      raise config_lib.ConfigError(
          f'finetune_epochs must be >= 1, got {self.finetune_epochs}.')


class FedAvgFineTuning(fedavg.FedAvg):
  """FedAvg; the global model and each client's fine-tuned copy are scored."""

  name = 'fedavg_ft'
  Settings = Settings

  def final_evaluations(self, global_weights):
    evaluations = super().final_evaluations(global_weights)
    logging.info('Fine-tuning the global model on every client for %d'
                 ' epoch(s).', self.settings.finetune_epochs)
    # A tag past the last round: shuffles of their own.
    fine_tuned = self.context.train_locally(
        global_weights, self.settings.finetune_epochs,
        tag=self.config.rounds + 1)
    evaluations.update(self.context.final_metrics('fine_tuned', fine_tuned,
                                                  plain=True))
    return evaluations
