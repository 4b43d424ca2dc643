"""The part of a model a client keeps of its own, and the whole it makes.

Personalization methods keep per-client state between rounds: Ditto, CGSV
and IAFL a whole model per client, FedRep only the head (the output layer)
on a shared body. A `ModelPart` says which variables a client's entry holds
(`extract`) and how it joins the global model to give the model the client
uses (`compose`), so one per-client store serves every method and is
evaluated as whole models.

The head of every architecture in tff_fair is its output layer: the last
`ModelSpec.head_variables` trainable variables (kernel and bias).
"""

import dataclasses

import tensorflow_federated as tff

ModelWeights = tff.learning.models.ModelWeights


@dataclasses.dataclass(frozen=True)
class ModelPart:
  """The trainable variables a client keeps of its own.

  Attributes:
    head_variables: How many trailing trainable variables (the head) the
      part holds; 0: the whole model, non-trainable variables included.
  """

  head_variables: int = 0

  def __post_init__(self):
    if self.head_variables < 0:
      raise ValueError(
          f'head_variables must be >= 0, got {self.head_variables}.')

  @property
  def is_whole(self) -> bool:
    return self.head_variables == 0

  def extract(self, weights: ModelWeights) -> ModelWeights:
    """The part of `weights` (a `ModelWeights` with only its variables)."""
    if self.is_whole:
      return weights
    self._check(weights)
    return ModelWeights(
        trainable=list(weights.trainable[-self.head_variables:]),
        non_trainable=[])

  def compose(self, weights: ModelWeights, part: ModelWeights
              ) -> ModelWeights:
    """The whole model: `weights` with `part` in place of its own part."""
    if self.is_whole:
      return part
    self._check(weights)
    return ModelWeights(
        trainable=[*weights.trainable[:-self.head_variables],
                   *part.trainable],
        non_trainable=list(weights.non_trainable))

  def _check(self, weights: ModelWeights) -> None:
    if len(weights.trainable) <= self.head_variables:
      raise ValueError(
          f'A head of {self.head_variables} variables needs a body: the'
          f' model has {len(weights.trainable)} trainable variables.')


WHOLE = ModelPart()


def head(head_variables: int) -> ModelPart:
  """The part made of the model's last `head_variables` trainable ones."""
  if head_variables < 1:
    raise ValueError(f'A head has >= 1 variable, got {head_variables}.')
  return ModelPart(head_variables)
