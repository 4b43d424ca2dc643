"""Byzantine clients for robustness experiments (usable with every algorithm).

A fixed, seeded set of clients is malicious for the whole run. Three attacks
from the Ditto paper's robustness study:

* A1 `label_poisoning`: a malicious client trains on random labels (a data
  attack: `poison_labels`, applied by the driver to the client's training
  split, so it works with any algorithm).
* A2 `random_updates`: a malicious client sends Gaussian noise with the same
  standard deviation (per tensor) as its real update.
* A3 `model_replacement`: a malicious client sends its update multiplied by
  `scale` (e.g. 10), to drag the global model towards its own.

A2 and A3 act on model updates, inside the client computation of
`tff_fair.algorithms.fed_avg` (and so of Ditto's global model): every client
receives an `AttackSpec` with its data, benign clients `no_attack()`.
Personalized models are never attacked: a malicious client only hurts the
others through what it sends.
"""

import collections
from collections.abc import Sequence
import dataclasses

import numpy as np
import tensorflow as tf

NONE = 'none'
LABEL_POISONING = 'label_poisoning'
RANDOM_UPDATES = 'random_updates'
MODEL_REPLACEMENT = 'model_replacement'
ATTACKS = (NONE, LABEL_POISONING, RANDOM_UPDATES, MODEL_REPLACEMENT)

# Streams folded into a client's seed (`client_seed`), one per use, so the
# draws of different uses never share a seed.
WIDTH_STREAM = 1  # Aequa's sampled widths.
NOISE_STREAM = 2  # A2's noise.

# Codes carried into TFF computations (update attacks only).
# (A1 is applied to data, so inside TFF it is 'no update attack'.)
_UPDATE_ATTACK_CODES = {NONE: 0, LABEL_POISONING: 0, RANDOM_UPDATES: 1,
                        MODEL_REPLACEMENT: 2}


@dataclasses.dataclass(frozen=True)
class AttackConfig:
  """Which clients attack, and how.

  Attributes:
    kind: One of `ATTACKS`.
    malicious_fraction: Fraction of all clients that are malicious (rounded
      to the nearest count; at least one when > 0).
    scale: Update multiplier of `model_replacement`.
    seed: Seeds the choice of malicious clients, random labels and noise.
  """

  kind: str = NONE
  malicious_fraction: float = 0.0
  scale: float = 10.0
  seed: int = 0

  def __post_init__(self):
    if self.kind not in ATTACKS:
      raise ValueError(
          f'Unknown attack {self.kind!r}; choose one of {", ".join(ATTACKS)}.')
    if not 0.0 <= self.malicious_fraction < 1.0:
      raise ValueError(
          'malicious_fraction must be in [0, 1), got'
          f' {self.malicious_fraction}.')
    if self.kind != NONE and self.malicious_fraction == 0.0:
      raise ValueError(
          f'Attack {self.kind!r} needs malicious_fraction > 0.')
    if not np.isfinite(self.scale):
      raise ValueError(f'scale must be finite, got {self.scale}.')


def choose_malicious(
    client_ids: Sequence[str], config: AttackConfig
) -> frozenset[str]:
  """The malicious clients: a seeded sample of the requested fraction."""
  if config.kind == NONE:
    return frozenset()
  count = max(1, int(round(config.malicious_fraction * len(client_ids))))
  rng = np.random.default_rng([config.seed, 0xA77AC])
  chosen = rng.choice(len(client_ids), size=count, replace=False)
  return frozenset(client_ids[i] for i in chosen)


def poison_labels(
    labels: np.ndarray, num_classes: int, seed: int, client_index: int
) -> np.ndarray:
  """A1: labels replaced by uniformly random classes (fixed per client)."""
  rng = np.random.default_rng([seed, 0x1AB, client_index])
  return rng.integers(0, num_classes, size=labels.shape).astype(labels.dtype)


def no_attack(seed: int = 0, client_index: int = 0) -> collections.OrderedDict:
  return attack_spec(NONE, scale=1.0, seed=seed, client_index=client_index)


def attack_spec(
    kind: str, scale: float, seed: int, client_index: int
) -> collections.OrderedDict:
  """The per-client attack input of the federated computations.

  Its `seed` (int32[2]) also seeds the client's other randomness (e.g.
  Aequa's sampled widths), so drivers give every client a fresh one each
  round, attacking or not.
  """
  return collections.OrderedDict(
      kind=np.int32(_UPDATE_ATTACK_CODES[kind]),
      scale=np.float32(scale),
      seed=np.array([seed, client_index], np.int32),
  )


def client_seed(seed, stream: int, index):
  """A seed for draw `index` of `stream` of one client, from its spec seed.

  Folds `stream`, then `index`, into the client's seed (int32[2], `[round
  seed, client index]` as the driver sends it) with
  `tf.random.experimental.stateless_fold_in`, which hashes the seed it
  receives. Adding offsets to the seed instead would make draws collide:
  `[s, i] + [0, k]` is client i's draw k and client i + 1's draw k - 1.

  Args:
    seed: The client's seed, an int32[2] tensor.
    stream: `WIDTH_STREAM`, `NOISE_STREAM`, ...
    index: The draw's index within the stream (e.g. the local step), an
      int32 scalar.

  Returns:
    An int32[2] seed for `tf.random.stateless_*`.
  """
  fold_in = tf.random.experimental.stateless_fold_in
  return fold_in(fold_in(seed, tf.constant(stream, tf.int32)),
                 tf.cast(index, tf.int32))


def attack_spec_type() -> collections.OrderedDict:
  return collections.OrderedDict(
      kind=tf.TensorSpec([], tf.int32),
      scale=tf.TensorSpec([], tf.float32),
      seed=tf.TensorSpec([2], tf.int32),
  )


def apply_update_attack(update, spec):
  """Applies A2/A3 to a client's model update (a structure of tensors).

  Args:
    update: The client's model update.
    spec: An `attack_spec` (as tensors).

  Returns:
    The update to send: unchanged, Gaussian noise with each tensor's own
    standard deviation (A2), or the update times `spec['scale']` (A3).
  """
  tensors = tf.nest.flatten(update)

  def noise():
    return [
        tf.random.stateless_normal(
            tf.shape(t), seed=client_seed(spec['seed'], NOISE_STREAM, i),
            dtype=t.dtype
        ) * tf.math.reduce_std(t)
        for i, t in enumerate(tensors)
    ]

  def scaled():
    return [t * tf.cast(spec['scale'], t.dtype) for t in tensors]

  attacked = tf.switch_case(
      spec['kind'],
      branch_fns=[lambda: tensors, noise, scaled],
  )
  return tf.nest.pack_sequence_as(update, attacked)
