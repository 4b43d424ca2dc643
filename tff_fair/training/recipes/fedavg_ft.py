"""FedAvg + fine-tuning: FedAvg, then each client fine-tunes the final model.

The personalization baseline of the Ditto paper: after the last round every
client trains the global model alone for `finetune_epochs` epochs on its
training split and is measured with the result ('fine_tuned'). Each client
also chooses how many of those epochs to keep, 0 (the global model) to
`finetune_epochs`, on its validation split ('validated';
`personalization.CHOICE_FILE` says what each client uses): on a client
whose few examples fine-tuning overfits, it keeps the global model.
"""

import dataclasses

from absl import logging

from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import personalization
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
  output_files = (personalization.CHOICE_FILE,)

  def final_evaluations(self, state, global_weights):
    evaluations = super().final_evaluations(state, global_weights)
    epochs = self.settings.finetune_epochs
    logging.info('Fine-tuning the global model on every client for 1 to %d'
                 ' epoch(s).', epochs)
    # A tag past the last round: shuffles of their own (the same for every
    # length, so e epochs continue the first e - 1).
    fine_tuned = {e: self.context.train_locally(
        global_weights, e, tag=self.config.rounds + 1)
                  for e in range(1, epochs + 1)}
    evaluations.update(self.context.final_metrics(
        'fine_tuned', fine_tuned[epochs], variant=experiment_lib.PLAIN))
    evaluations.update(personalization.validated_metrics(self.context, [
        personalization.Candidate('global', global_weights),
        *(personalization.Candidate(f'fine_tuned_{e}_epochs', models)
          for e, models in fine_tuned.items())]))
    return evaluations
