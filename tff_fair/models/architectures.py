"""Reference Keras architectures used across tff_fair.

Every builder returns a fresh, uncompiled `tf.keras.Model` that outputs
logits: `tff.learning.models.from_keras_model` needs a new model inside each
`model_fn` call, and the loss is always applied `from_logits=True`.

The architectures follow the source documents' experiments:

* `lenet`: LeNet-5 style CNN for small grayscale images (28x28 Fashion-MNIST,
  MNIST, FEMNIST; also 8x8 digits thanks to 'same' padding).
* `cifar_cnn`: the usual FL CIFAR-10 CNN (conv32-conv64-conv64, dense 64).
* `ditto_cnn`: the Fashion-MNIST CNN of the Ditto reference code
  (litian96/ditto, flearn/models/fmnist/cnn.py): conv32 5x5 'same', pool,
  conv64 5x5 'same', pool, dense 1024, logits.
* `fedavg_cnn`: PFLlib's FedAvgCNN, the model of its leaderboard: conv32
  5x5 'valid', pool, conv64 5x5 'valid', pool, dense 512, logits.
* `text_cnn`: Kim-style sentence CNN (embedding, parallel 1-D convolutions
  of widths 3/4/5, max-over-time pooling) for SST-2.
* `char_lstm`: TFF's Shakespeare next-character model (embedding 8, two
  LSTM layers of 256 units).
* `mlp`: the FedAvg paper's "2NN" for any image size (flatten, two ReLU
  layers of 200 units, logits): the small model of FL's first experiments;
  the tests' one-round runs build and train it in about three quarters of
  LeNet's time.
"""

from collections.abc import Callable, Sequence
from typing import Optional

import tensorflow as tf

ModelBuilder = Callable[[], tf.keras.Model]


def layer_seeds(seed: Optional[int]) -> Callable[[int], Optional[int]]:
  """Returns `index -> seed` giving each layer its own initializer seed.

  Layer `index` of a model built with `seed` gets `seed * 1000 + index`, so
  two models built with the same seed start from the same weights (plain and
  slimmable architectures alike); `seed=None` leaves initializers unseeded.

  Args:
    seed: The model's seed, or None.
  """
  if seed is None:
    return lambda _: None
  return lambda index: seed * 1000 + index


def lenet(
    input_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
    seed: Optional[int] = None,
) -> tf.keras.Model:
  """LeNet-5 style CNN: conv6-pool-conv16-pool-fc120-fc84-logits."""
  layer_seed = layer_seeds(seed)
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=layer_seed(i))
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=tuple(input_shape)),
      tf.keras.layers.Conv2D(
          6, 5, padding='same', activation='relu', kernel_initializer=init(0)
      ),
      tf.keras.layers.MaxPool2D(2, padding='same'),
      tf.keras.layers.Conv2D(
          16, 5, padding='same', activation='relu', kernel_initializer=init(1)
      ),
      tf.keras.layers.MaxPool2D(2, padding='same'),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(120, activation='relu', kernel_initializer=init(2)),
      tf.keras.layers.Dense(84, activation='relu', kernel_initializer=init(3)),
      tf.keras.layers.Dense(num_classes, kernel_initializer=init(4)),
  ])


def mlp(
    input_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
    seed: Optional[int] = None,
    hidden_units: Sequence[int] = (200, 200),
) -> tf.keras.Model:
  """Multilayer perceptron: flatten, ReLU layers of `hidden_units`, logits."""
  layer_seed = layer_seeds(seed)
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=layer_seed(i))
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=tuple(input_shape)),
      tf.keras.layers.Flatten(),
      *(tf.keras.layers.Dense(units, activation='relu',
                              kernel_initializer=init(i))
        for i, units in enumerate(hidden_units)),
      tf.keras.layers.Dense(num_classes,
                            kernel_initializer=init(len(hidden_units))),
  ])


def cifar_cnn(
    input_shape: Sequence[int] = (32, 32, 3),
    num_classes: int = 10,
    seed: Optional[int] = None,
) -> tf.keras.Model:
  """CIFAR-10 CNN: conv32-pool-conv64-pool-conv64-fc64-logits."""
  layer_seed = layer_seeds(seed)
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=layer_seed(i))
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=tuple(input_shape)),
      tf.keras.layers.Conv2D(
          32, 3, activation='relu', kernel_initializer=init(0)
      ),
      tf.keras.layers.MaxPool2D(2),
      tf.keras.layers.Conv2D(
          64, 3, activation='relu', kernel_initializer=init(1)
      ),
      tf.keras.layers.MaxPool2D(2),
      tf.keras.layers.Conv2D(
          64, 3, activation='relu', kernel_initializer=init(2)
      ),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(64, activation='relu', kernel_initializer=init(3)),
      tf.keras.layers.Dense(num_classes, kernel_initializer=init(4)),
  ])


def check_two_conv_input(input_shape: Sequence[int], padding: str) -> None:
  """Refuses inputs two 5x5 'valid' convolutions with pooling leave empty."""
  if padding == 'valid' and min(input_shape[:2]) < 16:
    raise ValueError(
        f'Inputs of shape {tuple(input_shape)} are too small for two 5x5'
        " 'valid' convolutions with pooling (at least 16x16 needed); use"
        ' ditto_cnn (same padding) or lenet.')


def two_conv_cnn(
    input_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
    seed: Optional[int] = None,
    hidden_units: int = 1024,
    padding: str = 'same',
) -> tf.keras.Model:
  """conv32 5x5 - pool - conv64 5x5 - pool - dense - logits (ReLU).

  `ditto_cnn` is this with 'same' padding and 1024 hidden units (the Ditto
  reference code's Fashion-MNIST model); `fedavg_cnn` with 'valid' padding
  and 512 (PFLlib's FedAvgCNN).

  Raises:
    ValueError: If 'valid' padding leaves no pixels (inputs under 16x16).
  """
  check_two_conv_input(input_shape, padding)
  layer_seed = layer_seeds(seed)
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=layer_seed(i))
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=tuple(input_shape)),
      tf.keras.layers.Conv2D(32, 5, padding=padding, activation='relu',
                             kernel_initializer=init(0)),
      tf.keras.layers.MaxPool2D(2, padding='same'),
      tf.keras.layers.Conv2D(64, 5, padding=padding, activation='relu',
                             kernel_initializer=init(1)),
      tf.keras.layers.MaxPool2D(2, padding='same'),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(hidden_units, activation='relu',
                            kernel_initializer=init(2)),
      tf.keras.layers.Dense(num_classes, kernel_initializer=init(3)),
  ])


def text_cnn(
    sequence_length: int,
    vocab_size: int,
    num_classes: int = 2,
    embedding_dim: int = 64,
    filters: int = 64,
    kernel_sizes: Sequence[int] = (3, 4, 5),
    seed: Optional[int] = None,
) -> tf.keras.Model:
  """Kim (2014) style sentence CNN over token ids (0 is padding)."""
  layer_seed = layer_seeds(seed)
  tokens = tf.keras.Input(shape=(sequence_length,), dtype=tf.int32)
  embedded = tf.keras.layers.Embedding(
      vocab_size,
      embedding_dim,
      embeddings_initializer=tf.keras.initializers.RandomUniform(
          -0.05, 0.05, seed=layer_seed(0)
      ),
  )(tokens)
  pooled = []
  for i, size in enumerate(kernel_sizes):
    conv = tf.keras.layers.Conv1D(
        filters,
        size,
        activation='relu',
        padding='same',
        kernel_initializer=tf.keras.initializers.GlorotUniform(
            seed=layer_seed(i + 1)
        ),
    )(embedded)
    pooled.append(tf.keras.layers.GlobalMaxPool1D()(conv))
  features = tf.keras.layers.Concatenate()(pooled)
  logits = tf.keras.layers.Dense(
      num_classes,
      kernel_initializer=tf.keras.initializers.GlorotUniform(
          seed=layer_seed(len(kernel_sizes) + 1)
      ),
  )(features)
  return tf.keras.Model(tokens, logits)


def char_lstm(
    sequence_length: int,
    vocab_size: int,
    embedding_dim: int = 8,
    units: int = 256,
    seed: Optional[int] = None,
) -> tf.keras.Model:
  """TFF's Shakespeare model: per-position next-character logits."""
  layer_seed = layer_seeds(seed)
  glorot = lambda i: tf.keras.initializers.GlorotUniform(seed=layer_seed(i))
  orthogonal = lambda i: tf.keras.initializers.Orthogonal(seed=layer_seed(i))
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(
          input_shape=(sequence_length,), dtype=tf.int32
      ),
      tf.keras.layers.Embedding(
          vocab_size,
          embedding_dim,
          embeddings_initializer=tf.keras.initializers.RandomUniform(
              -0.05, 0.05, seed=layer_seed(0)
          ),
      ),
      tf.keras.layers.LSTM(
          units,
          return_sequences=True,
          kernel_initializer=glorot(1),
          recurrent_initializer=orthogonal(2),
      ),
      tf.keras.layers.LSTM(
          units,
          return_sequences=True,
          kernel_initializer=glorot(3),
          recurrent_initializer=orthogonal(4),
      ),
      tf.keras.layers.Dense(vocab_size, kernel_initializer=glorot(5)),
  ])
