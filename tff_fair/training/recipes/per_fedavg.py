"""Per-FedAvg (Fallah et al. 2020): a global model made to adapt in one step.

The global model trains by Per-FedAvg's meta-steps
(`tff_fair.algorithms.per_fedavg`; first-order or Hessian-free), its
server step FedAvg's. A client's personalized model is
`per_fedavg_adapt_steps` SGD steps at rate alpha from the global model on
the client's training data only (`RunContext.train_locally`): never its
validation or test split. It is rebuilt from the current global model
whenever the clients are measured, so nothing per client is kept between
rounds.

Per round the evaluation measures the adapted models (`test_*`) and the
global model (`global_test_*`); after the last round 'global',
'personalized' (the adapted models) and 'validated' (each client's choice
of the two on its validation split: `personalization`).
"""

import dataclasses
import math

import tensorflow_federated as tff

from tff_fair.algorithms import per_fedavg as per_fedavg_lib
from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training import personalization
from tff_fair.training.recipes import recipe

# Shuffles of the adaptation steps: one fixed order, so a client's adapted
# model is a function of the global model alone.
ADAPTATION_TAG = 0
# The paper's typical inner step size.
ALPHA = 0.01


@dataclasses.dataclass(frozen=True)
class Settings:
  """Attributes:

    per_fedavg_variant: 'fo' (first-order) or 'hf' (Hessian-free).
    per_fedavg_alpha: The inner step size of the meta-steps, also the
      adaptation's. The meta-step itself is the client optimizer's, at the
      client learning rate (the paper's beta). The default is the paper's
      typical 0.01, not the client rate: at FEMNIST's client rate of 0.1
      the meta-steps diverge (`docs/algorithms/per_fedavg.md`).
    per_fedavg_hessian_product: 'hf': how the Hessian-vector product of
      the meta-gradient is computed: 'exact' (by differentiating the
      gradient) or 'finite_difference' (the paper's, of radius
      `per_fedavg_delta`; inaccurate on ReLU and max-pooling networks:
      `docs/algorithms/per_fedavg.md`).
    per_fedavg_delta: 'hf' with 'finite_difference': its radius.
    per_fedavg_adapt_steps: SGD steps from the global model on a client's
      training data that make its personalized model.
  """

  per_fedavg_variant: str = config_lib.setting(
      'fo', 'fo (first-order) or hf (Hessian-free meta-steps).',
      choices=per_fedavg_lib.VARIANTS)
  per_fedavg_alpha: float = config_lib.setting(
      ALPHA, 'inner and adaptation step size; the meta-step is the client'
      ' optimizer\'s, at the client learning rate.')
  per_fedavg_hessian_product: str = config_lib.setting(
      per_fedavg_lib.HESSIAN_PRODUCTS[0],
      'hf: the Hessian-vector product, exact (by differentiating the'
      ' gradient) or finite_difference (the paper\'s, of radius'
      ' --per_fedavg_delta; inaccurate on ReLU and max-pooling networks).',
      choices=per_fedavg_lib.HESSIAN_PRODUCTS)
  per_fedavg_delta: float = config_lib.setting(
      1e-3, 'hf with the finite_difference product: its radius.')
  per_fedavg_adapt_steps: int = config_lib.setting(
      1, 'SGD steps from the global model on a client\'s training data that'
      ' make its personalized model.', resumable=True)

  def __post_init__(self):
    config_lib.check_choice('per_fedavg_variant', self.per_fedavg_variant,
                            per_fedavg_lib.VARIANTS)
    config_lib.check_choice('per_fedavg_hessian_product',
                            self.per_fedavg_hessian_product,
                            per_fedavg_lib.HESSIAN_PRODUCTS)
    config_lib.check_learning_rate('per_fedavg_alpha', self.per_fedavg_alpha)
    if not (math.isfinite(self.per_fedavg_delta)
            and self.per_fedavg_delta > 0):
      raise config_lib.ConfigError(
          'per_fedavg_delta must be a finite number > 0, got'
          f' {self.per_fedavg_delta}.')
    # A setting the run would ignore is refused, as the shared ones are.
    defaults = config_lib.settings_defaults(Settings)
    if (self.per_fedavg_variant != 'hf' and self.per_fedavg_hessian_product
        != defaults['per_fedavg_hessian_product']):
      raise config_lib.ConfigError(
          f'--per_fedavg_hessian_product={self.per_fedavg_hessian_product}'
          ' would be ignored: only the Hessian-free variant computes one.'
          ' Add --per_fedavg_variant=hf or drop the setting.')
    if (self.per_fedavg_delta != defaults['per_fedavg_delta'] and (
        self.per_fedavg_variant != 'hf'
        or self.per_fedavg_hessian_product != 'finite_difference')):
      raise config_lib.ConfigError(
          f'--per_fedavg_delta={self.per_fedavg_delta} would be ignored: only'
          ' the finite-difference product has a radius. Add'
          ' --per_fedavg_variant=hf'
          ' --per_fedavg_hessian_product=finite_difference or drop it.')
    if self.per_fedavg_adapt_steps < 1:
      raise config_lib.ConfigError(
          'per_fedavg_adapt_steps must be >= 1, got'
          f' {self.per_fedavg_adapt_steps}.')


class PerFedAvg(recipe.Recipe):
  """Per-FedAvg's global model and each client's adapted model."""

  name = 'per_fedavg'
  Settings = Settings
  output_files = (personalization.CHOICE_FILE,)

  def __init__(self, context):
    super().__init__(context)
    # One object: `train_locally` builds its computation once.
    self._adaptation_optimizer = tff.learning.optimizers.build_sgdm(
        learning_rate=self.settings.per_fedavg_alpha)

  def build_process(self):
    settings = self.settings
    return per_fedavg_lib.build_per_fedavg(
        self.model_fn, self.client_optimizer(), self.server_optimizer(),
        alpha=settings.per_fedavg_alpha,
        variant=settings.per_fedavg_variant,
        delta=settings.per_fedavg_delta,
        hessian_product=settings.per_fedavg_hessian_product,
        model_aggregator=self.model_aggregator(), client_context=True)

  def adapted_models(self, global_weights):
    """Each client's personalized model: steps on its training split."""
    return self.context.train_locally(
        global_weights, tag=ADAPTATION_TAG,
        steps=self.settings.per_fedavg_adapt_steps,
        optimizer=self._adaptation_optimizer)

  def evaluation_models(self, state, global_weights, client_ids):
    """The adapted models (`test_*`) and the global one (`global_test_*`)."""
    return {'': (self.adapted_models(global_weights), client_ids),
            'global_': (global_weights, client_ids)}, {}

  def final_evaluations(self, state, global_weights):
    evaluations = super().final_evaluations(state, global_weights)
    adapted = self.adapted_models(global_weights)
    evaluations.update(self.context.final_metrics(
        'personalized', adapted, variant=experiment_lib.PLAIN))
    evaluations.update(personalization.validated_metrics(self.context, [
        personalization.Candidate('global', global_weights),
        personalization.Candidate('personalized', adapted)]))
    return evaluations
