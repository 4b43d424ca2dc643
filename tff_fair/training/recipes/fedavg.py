"""FedAvg (McMahan et al. 2017): the global model, and nothing else.

tff_fair's FedAvg (`tff_fair.algorithms.fed_avg`) is TFF's with a client
context input, so every attack of `tff_fair.attacks` runs with it.
"""

from tff_fair.algorithms import fed_avg
from tff_fair.training.recipes import recipe


class FedAvg(recipe.Recipe):
  """FedAvg; evaluates the global model on every client."""

  name = 'fedavg'

  def build_process(self):
    return fed_avg.build_fed_avg(
        self.model_fn, self.client_optimizer(), self.server_optimizer(),
        model_aggregator=self.model_aggregator(), client_context=True)
