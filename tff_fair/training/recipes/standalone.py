"""Standalone training: every client trains a model alone; no federation.

The lower baseline of the source documents: each client trains from the
common initial model with the budget of local epochs it would have had in
federated training (`RunContext.standalone_epochs`), and is measured with
its own model ('standalone'). No federated round runs.
"""

from tff_fair.training.recipes import fedavg


class Standalone(fedavg.FedAvg):
  """Per-client models trained alone from the initial model."""

  name = 'standalone'
  trains_federated = False

  def final_evaluations(self, global_weights):
    # With no round run, the "global" weights are the initial model.
    return self.context.final_metrics('standalone', self.context.train_locally(
        global_weights, self.context.standalone_epochs(), tag=0), plain=True)
