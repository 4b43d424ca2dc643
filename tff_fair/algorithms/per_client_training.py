"""Training one model per client, each alone: fine-tuning and standalone.

Two baselines of the source documents are the same computation started from
different weights:

* FedAvg + fine-tuning: every client trains the final global model for a few
  epochs on its own training split.
* Standalone: every client trains alone from the common initial model, with
  the budget of local steps it would have had in federated training.

`build_per_client_training` returns a federated computation

    (<w@SERVER, {D*}@CLIENTS> -> {w_k}@CLIENTS)

that broadcasts `w`, trains it on each client's data for `epochs` passes (or
`steps` batches: Per-FedAvg's adaptation) with a
`tff.learning.optimizers.Optimizer`, and returns the per-client weights.
The result is CLIENTS-placed by design: personalized models are never
aggregated. The local C++ runtime returns it as a Python list, one entry per
client, in the order the client data was given.
"""

from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

from tff_fair.algorithms import training_loop


def build_client_train_fn(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    optimizer: tff.learning.optimizers.Optimizer,
    epochs: Optional[int] = None,
    *,
    steps: Optional[int] = None,
) -> tff.Computation:
  """The per-client TF computation `(<w, D*> -> w_k)`.

  Exactly one of `epochs` (passes over the data) and `steps` (batches,
  cycling through the data as often as needed) must be given, >= 1.
  """
  if (epochs is None) == (steps is None):
    raise ValueError('Give exactly one of epochs and steps.')
  count = epochs if steps is None else steps
  if count < 1:
    raise ValueError(f'{"epochs" if steps is None else "steps"} must be >= 1,'
                     f' got {count}.')
  weights_type = tff.learning.models.weights_type_from_model(model_fn)

  @tff.tensorflow.computation(weights_type,
                              training_loop.data_type_of(model_fn))
  def train(initial_weights, data):
    loop = training_loop.build_training_loop(model_fn(), optimizer)
    batches = (data.repeat(epochs) if steps is None
               else data.repeat().take(steps))
    return loop(initial_weights, batches)['weights']

  return train


def build_per_client_training(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    optimizer: tff.learning.optimizers.Optimizer,
    epochs: Optional[int] = None,
    *,
    steps: Optional[int] = None,
) -> tff.Computation:
  """Builds `(<w@SERVER, {D*}@CLIENTS> -> {w_k}@CLIENTS)`.

  Args:
    model_fn: No-arg callable returning a fresh `VariableModel`.
    optimizer: The client optimizer, e.g. `tff.learning.optimizers.
      build_sgdm(learning_rate=0.05)`.
    epochs: Passes over each client's data set; or
    steps: Batches each client trains on (its data repeated as needed).

  Returns:
    A `tff.Computation`; see the module docstring.
  """
  train = build_client_train_fn(model_fn, optimizer, epochs, steps=steps)
  weights_type = train.type_signature.parameter[0]
  data_type = train.type_signature.parameter[1]

  @tff.federated_computation(
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def train_each_client(weights, client_data):
    return tff.federated_map(
        train, (tff.federated_broadcast(weights), client_data)
    )

  return train_each_client
