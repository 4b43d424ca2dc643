"""Update attacks inside the TFF client computation, and the spec behind them.

Every client of a process built with `client_context=True`
(`tff_fair.algorithms.fed_avg`) receives an attack spec with its data: which
update attack it makes (`tff_fair.attacks`: A2 `random_updates`, A3
`model_replacement`; benign clients and A1's data attack `no_attack()`),
with what scale, and a seed. `apply_update_attack` turns the client's real
update into the one it sends. The spec's `seed` also seeds the client's
other randomness (`client_seed`: Aequa's sampled widths), so drivers give
every client a fresh one each round, attacking or not.

Personalized models are never attacked: a malicious client only hurts the
others through what it sends.
"""

import collections

import numpy as np
import tensorflow as tf

from tff_fair import attacks

# Streams folded into a client's seed (`client_seed`), one per use, so the
# draws of different uses never share a seed.
WIDTH_STREAM = 1  # Aequa's sampled widths.
NOISE_STREAM = 2  # A2's noise.

# Codes carried into TFF computations (update attacks only).
# (A1 is applied to data, so inside TFF it is 'no update attack'.)
_UPDATE_ATTACK_CODES = {attacks.NONE: 0, attacks.LABEL_POISONING: 0,
                        attacks.RANDOM_UPDATES: 1,
                        attacks.MODEL_REPLACEMENT: 2}


def no_attack(seed: int = 0, client_index: int = 0) -> collections.OrderedDict:
  """The spec of a client that sends its real update (A1 attacks data)."""
  return attack_spec(attacks.NONE, scale=1.0, seed=seed,
                     client_index=client_index)


def attack_spec(
    kind: str, scale: float, seed: int, client_index: int
) -> collections.OrderedDict:
  """The per-client attack input of the federated computations.

  Its `seed` (int32[2]) also seeds the client's other randomness (e.g.
  Aequa's sampled widths), so drivers give every client a fresh one each
  round, attacking or not.

  Args:
    kind: One of `tff_fair.attacks.ATTACKS`.
    scale: The update multiplier of `model_replacement`.
    seed: The round's seed.
    client_index: The client's index (the seed's second half).
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
  """The `tf.TensorSpec`s of an `attack_spec` (its TFF type's source)."""
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
