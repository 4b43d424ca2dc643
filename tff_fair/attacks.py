"""Byzantine clients for robustness experiments (usable with every algorithm).

A fixed, seeded set of clients is malicious for the whole run. Three attacks
from the Ditto paper's robustness study:

* A1 `label_poisoning`: a malicious client trains on random labels (a data
  attack: `noisy_labels` of every label, applied by the driver to the client's training
  split, so it works with any algorithm).
* A2 `random_updates`: a malicious client sends Gaussian noise with the same
  standard deviation (per tensor) as its real update.
* A3 `model_replacement`: a malicious client sends its update multiplied by
  `scale` (e.g. 10), to drag the global model towards its own.

This module is the plain-numpy part: the attacks' names, which clients are
malicious and A1's labels. A2 and A3 act on model updates, inside the client
computation of `tff_fair.algorithms.fed_avg` (and so of Ditto's global
model); they live with the algorithms, in
`tff_fair.algorithms.update_attacks`.
"""

from collections.abc import Sequence
import dataclasses

import numpy as np

NONE = 'none'
LABEL_POISONING = 'label_poisoning'
RANDOM_UPDATES = 'random_updates'
MODEL_REPLACEMENT = 'model_replacement'
ATTACKS = (NONE, LABEL_POISONING, RANDOM_UPDATES, MODEL_REPLACEMENT)


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
    if (self.kind == NONE) != (self.malicious_fraction == 0.0):
      raise ValueError(
          'An attack needs malicious_fraction > 0, and malicious_fraction > 0'
          f' needs an attack; got attack={self.kind!r},'
          f' malicious_fraction={self.malicious_fraction}.')
    if not np.isfinite(self.scale):
      raise ValueError(
          f'attack_scale must be a finite number, got {self.scale}.')


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


def noisy_labels(
    labels: np.ndarray, num_classes: int, fraction: float, seed: int,
    client_index: int,
) -> np.ndarray:
  """A `fraction` of the labels replaced by uniformly random classes.

  The labels replaced (round(fraction * n), drawn at random) and their new
  classes are fixed per client and seed; a new class may equal the old one.
  Fraction 1 replaces every label: attack A1's random labels, and a free
  rider's in `--label_noise_file`.
  """
  rng = np.random.default_rng([seed, 0x1AB, client_index])
  random_labels = rng.integers(0, num_classes, size=labels.shape).astype(
      labels.dtype)
  if fraction >= 1.0:
    return random_labels
  replaced = rng.choice(labels.size, size=int(round(fraction * labels.size)),
                        replace=False)
  noisy = labels.copy()
  noisy[replaced] = random_labels[replaced]
  return noisy
