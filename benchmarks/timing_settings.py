"""The settings `round_time` and `round_phases` time, in one place.

`pfllib` is the PFLlib comparison (Fashion-MNIST label skew #C=2, 20
clients x 300 training examples, batch 10, SGD lr 0.005, Ditto lambda 0.1,
one personal epoch, PFLlib's FedAvgCNN: `fedavg_cnn`); `readme` is the
README's Ditto benchmark (batch 16, lr 0.05, LeNet).
"""

from collections.abc import Iterable
import dataclasses

from absl import app

from tff_fair.models import names as model_names
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import registry


@dataclasses.dataclass(frozen=True)
class Setting:
  model: str
  batch_size: int
  learning_rate: float
  ditto_lambda: float


SETTINGS = {
    'pfllib': Setting('fedavg_cnn', 10, 0.005, 0.1),
    'readme': Setting('lenet', 16, 0.05, 0.1),
}


def check_flags(rounds: int, systems: Iterable[str],
                known: Iterable[str]) -> None:
  """Refuses --rounds < 3 and unknown --systems (`app.UsageError`)."""
  if rounds < 3:
    raise app.UsageError('--rounds must be >= 3 (round 1 is not counted).')
  unknown = set(systems) - set(known)
  if unknown:
    raise app.UsageError(f'Unknown --systems {sorted(unknown)}; choose from'
                         f' {", ".join(known)}.')


def has_slimmable_version(model: str) -> bool:
  return f'slimmable_{model}' in model_names.SLIMMABLE_MODELS


def make_config(setting: Setting, model: str, algorithm: str = 'fedavg', *,
                clients: int, rounds: int, data_dir: str, output_dir: str,
                **overrides) -> config_lib.RunConfig:
  """The run configuration of `algorithm` in `setting` (every client each
  round, 300 training and 100 test examples each, one local epoch)."""
  values = dict(
      algorithm=algorithm, dataset='fashion_mnist', partition='label_skew',
      classes_per_client=2, num_clients=clients, clients_per_round=clients,
      examples_per_client=400, validation_fraction=0.0, test_fraction=0.25,
      batch_size=setting.batch_size,
      client_learning_rate=setting.learning_rate,
      model=model, rounds=rounds, seed=0, data_dir=data_dir,
      output_dir=output_dir)
  values.update(overrides)
  return registry.make_config(**values)
