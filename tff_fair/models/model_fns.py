"""Model specifications and `model_fn` helpers for `tff.learning`.

A `ModelSpec` is everything the rest of tff_fair needs to know about a model:
how to build a fresh Keras model (optionally with seeded initial weights) and
how to wrap it as a `tff.learning.models.VariableModel` for a given input
spec. Keeping the builder separate from the TFF wrapper lets evaluation run
the same architecture as plain Keras, outside any federated computation.
"""

import collections
from collections.abc import Callable, Sequence
import dataclasses
import functools
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.models import architectures

KerasBuilder = Callable[[Optional[int]], tf.keras.Model]

MODEL_NAMES = ('lenet', 'cifar_cnn', 'ditto_cnn', 'fedavg_cnn', 'text_cnn',
               'char_lstm')


def loss_fn() -> tf.keras.losses.Loss:
  """The loss every tff_fair model trains with (models output logits)."""
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def metrics_fn() -> list[tf.keras.metrics.Metric]:
  return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A model architecture bound to the shape of one data set.

  Attributes:
    name: One of `MODEL_NAMES`.
    build_keras: `seed -> tf.keras.Model`, a fresh uncompiled model that
      outputs logits. `seed=None` leaves initializers unseeded.
    input_spec: The batched element spec, `OrderedDict(x=..., y=...)`.
  """

  name: str
  build_keras: KerasBuilder
  input_spec: object

  def model_fn(self) -> tff.learning.models.VariableModel:
    """Builds a fresh `VariableModel` (call inside each `model_fn`)."""
    return tff.learning.models.from_keras_model(
        self.build_keras(None),
        loss=loss_fn(),
        input_spec=self.input_spec,
        metrics=metrics_fn(),
    )

  def initial_weights(self, seed: int) -> tff.learning.models.ModelWeights:
    """Deterministic initial weights for `seed` (numpy values)."""
    model = self.build_keras(seed)
    return tff.learning.models.ModelWeights(
        trainable=[v.numpy() for v in model.trainable_variables],
        non_trainable=[v.numpy() for v in model.non_trainable_variables],
    )


def batched_input_spec(
    x_shape: Sequence[int], x_dtype: tf.DType, y_shape: Sequence[int]
):
  """The element spec of a batched `OrderedDict(x=..., y=...)` data set."""
  return collections.OrderedDict(
      x=tf.TensorSpec([None, *x_shape], x_dtype),
      y=tf.TensorSpec([None, *y_shape], tf.int32),
  )


def build_model_spec(
    name: str,
    *,
    x_shape: Sequence[int],
    x_dtype: tf.DType,
    y_shape: Sequence[int],
    num_classes: int,
    vocab_size: Optional[int] = None,
) -> ModelSpec:
  """Binds architecture `name` to a data set's shapes.

  Args:
    name: One of `MODEL_NAMES`.
    x_shape: Shape of one example's features (no batch dimension).
    x_dtype: Feature dtype (float32 images, int32 token ids).
    y_shape: Shape of one example's label: `()` for classification, `(L,)`
      for next-character prediction.
    num_classes: Number of output classes (vocabulary size for `char_lstm`).
    vocab_size: Number of input tokens, required by the text models.

  Returns:
    A `ModelSpec`.

  Raises:
    ValueError: For an unknown name or a missing `vocab_size`.
  """
  if name not in MODEL_NAMES:
    raise ValueError(
        f'Unknown model {name!r}; choose one of {", ".join(MODEL_NAMES)}.'
    )
  if name in ('text_cnn', 'char_lstm') and not vocab_size:
    raise ValueError(
        f'Model {name!r} reads token ids and needs vocab_size; the data set'
        ' does not provide one (is it a text data set?).'
    )
  if name == 'lenet':
    builder = functools.partial(
        architectures.lenet, input_shape=x_shape, num_classes=num_classes
    )
  elif name == 'cifar_cnn':
    builder = functools.partial(
        architectures.cifar_cnn, input_shape=x_shape, num_classes=num_classes
    )
  elif name in ('ditto_cnn', 'fedavg_cnn'):
    builder = functools.partial(
        architectures.two_conv_cnn, input_shape=x_shape,
        num_classes=num_classes,
        **(dict(hidden_units=1024, padding='same') if name == 'ditto_cnn'
           else dict(hidden_units=512, padding='valid')))
  elif name == 'text_cnn':
    builder = functools.partial(
        architectures.text_cnn,
        sequence_length=x_shape[0],
        vocab_size=vocab_size,
        num_classes=num_classes,
    )
  else:
    builder = functools.partial(
        architectures.char_lstm,
        sequence_length=x_shape[0],
        vocab_size=vocab_size,
    )
  return ModelSpec(
      name=name,
      build_keras=lambda seed: builder(seed=seed),
      input_spec=batched_input_spec(x_shape, x_dtype, y_shape),
  )
