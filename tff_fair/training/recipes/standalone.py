"""Standalone training: every client trains a model alone; no federation.

The lower baseline of the source documents: each client trains from the
common initial model with the budget of local epochs it would have had in
federated training (`RunContext.standalone_epochs`), and is measured with
its own model ('standalone'). No federated round runs.
"""

from tff_fair import attacks
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training.recipes import fedavg

_NO_SERVER = 'standalone clients train alone, with no server step'


class Standalone(fedavg.FedAvg):
  """Per-client models trained alone from the initial model."""

  name = 'standalone'
  trains_federated = False
  # The budget of local epochs (`RunContext.standalone_epochs`) reads
  # clients_per_round and local_epochs; a data attack poisons the training.
  reads = {
      **{name: config_lib.READS_ALL[name] for name in (
          'clients_per_round', 'local_epochs', 'batch_size',
          'client_optimizer', 'client_learning_rate')},
      'attack': (attacks.NONE, attacks.LABEL_POISONING),
  }
  ignored_because = {
      'server_optimizer': _NO_SERVER,
      'server_learning_rate': _NO_SERVER,
      'aggregator': 'standalone clients send no updates',
      'attack': 'standalone clients send no updates to attack (a data'
                ' attack, --attack=label_poisoning, applies)',
      'eval_every': 'standalone training runs no federated rounds: its'
                    ' models are measured once, after training',
  }

  def final_evaluations(self, state, global_weights):
    # With no round run, the "global" weights are the initial model.
    return self.context.final_metrics(
        'standalone', self.context.train_locally(
            global_weights, self.context.standalone_epochs(), tag=0),
        variant=experiment_lib.PLAIN)
