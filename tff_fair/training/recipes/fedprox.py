"""FedProx (Li et al. 2020): FedAvg with a proximal term; a Ditto baseline.

Each client minimizes F_k(w) + (mu/2)||w - w^t||^2 from the global model
w^t: every local step adds mu * (w - w^t) to the gradient
(`training_loop.build_training_loop` anchored at w^t), inside tff_fair's
FedAvg, so the attacks and aggregators of the other algorithms apply.

Not TFF's `tff.learning.algorithms.build_weighted_fed_prox`: in TFF 0.87
its client step adds mu * (w^t - w), the opposite sign, which drives
clients away from the global model (tests/training/recipes/fedprox_test.py
shows it).
"""

import dataclasses
import math

from tff_fair.algorithms import fed_avg
from tff_fair.algorithms import training_loop
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import recipe


@dataclasses.dataclass(frozen=True)
class Settings:
  """Attributes:

    fedprox_mu: The proximal strength mu (>= 0; 0 is FedAvg).
  """

  fedprox_mu: float = config_lib.setting(
      0.01, 'proximal strength mu (>= 0; 0 is FedAvg).')

  def __post_init__(self):
    if not (math.isfinite(self.fedprox_mu) and self.fedprox_mu >= 0):
      raise config_lib.ConfigError(
          f'fedprox_mu must be a finite number >= 0, got {self.fedprox_mu}.')


def proximal_training_loop(mu: float) -> fed_avg.TrainingLoopFn:
  """FedAvg's local loop with the proximal term mu, anchored at the start."""

  def build(model, optimizer):
    train = training_loop.build_training_loop(model, optimizer)

    def loop(start, data, seed):
      del seed  # The loop draws nothing at random.
      return train(start, data, anchor=start, lam=mu)

    return loop

  return build


class FedProx(recipe.Recipe):
  """FedProx; evaluates the global model on every client."""

  name = 'fedprox'
  Settings = Settings

  def build_process(self):
    return fed_avg.build_fed_avg(
        self.model_fn, self.client_optimizer(), self.server_optimizer(),
        model_aggregator=self.model_aggregator(), client_context=True,
        training_loop_fn=proximal_training_loop(self.settings.fedprox_mu))
