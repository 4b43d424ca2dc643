"""Which clients train in a round, and the data each one trains on.

Everything here is a pure function of the run's seed and the round (and the
client's position in the data), never of a random generator's history, so a
run resumed from the checkpoint of round r continues exactly as the
uninterrupted run would have.
"""

import collections
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_fair import attacks
from tff_fair.training import experiment as experiment_lib


def sample_clients(
    client_ids: Sequence[str], clients_per_round: int, seed: int,
    round_num: int,
) -> list[str]:
  """Uniform sample without replacement, a pure function of (seed, round)."""
  rng = np.random.default_rng([seed, round_num])
  chosen = rng.choice(len(client_ids), size=clients_per_round, replace=False)
  return [client_ids[i] for i in sorted(chosen)]


def shuffle_seed(seed: int, round_num: int, client_index: int,
                 stream: int = 0) -> int:
  """The shuffle seed of one client's data in one round (and stream)."""
  return int(np.random.default_rng([seed, round_num, client_index, stream])
             .integers(0, 2**31 - 1))


def training_arrays(
    experiment: experiment_lib.Experiment, client_id: str,
    label_noise: Mapping[str, float], client_index: Mapping[str, int],
) -> tuple[np.ndarray, np.ndarray]:
  """A client's training split as it trains on it, its noisy labels too.

  `label_noise` maps clients to the fraction of their labels replaced by
  random ones (1 for attack A1's clients); others keep theirs.
  """
  x, y = experiment.data.arrays(client_id, 'train')
  fraction = label_noise.get(client_id, 0.0)
  if fraction > 0:
    y = attacks.noisy_labels(y, experiment.data.source.num_classes, fraction,
                             experiment.config.seed, client_index[client_id])
  return x, y


def client_datasets(
    experiment: experiment_lib.Experiment,
    client_ids: Sequence[str],
    round_num: int,
    epochs: int,
    *,
    stream: int = 0,
    label_noise: Optional[Mapping[str, float]] = None,
    client_index: Optional[Mapping[str, int]] = None,
) -> list[tf.data.Dataset]:
  """Shuffled, repeated, batched training data for `client_ids`.

  Args:
    experiment: The run.
    client_ids: Clients to serve, in order.
    round_num: Seeds the shuffle together with the run's seed.
    epochs: Passes over each client's training split.
    stream: Separates independent shuffles of the same round (e.g. Ditto's
      personal epochs in the sequential variant).
    label_noise: Client -> fraction of its labels replaced by random ones
      (attack A1, `--label_noise_file`); default none.
    client_index: Client id -> position in `experiment.data.client_ids`
      (seeds shuffles); pass it to avoid rebuilding it every round.

  Returns:
    One `tf.data.Dataset` per client.
  """
  config = experiment.config
  data = experiment.data
  index = client_index or {cid: i for i, cid in enumerate(data.client_ids)}
  datasets = []
  for cid in client_ids:
    x, y = training_arrays(experiment, cid, label_noise or {}, index)
    ds = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).shuffle(
            len(y), seed=shuffle_seed(config.seed, round_num, index[cid],
                                      stream),
            reshuffle_each_iteration=True)
    datasets.append(ds.repeat(epochs).batch(config.batch_size))
  return datasets


