"""Model specifications and `model_fn` helpers for `tff.learning`.

A `ModelSpec` is everything the rest of tff_fair needs to know about a model:
how to build a fresh Keras model (optionally with seeded initial weights) and
how to wrap it as a `tff.learning.models.VariableModel` for a given input
spec. Keeping the builder separate from the TFF wrapper lets evaluation run
the same architecture as plain Keras, outside any federated computation.
`build_model_spec` makes one for every architecture, plain
(`architectures.py`) or slimmable (`slimmable_models.py`).
"""

import collections
from collections.abc import Callable, Sequence
import dataclasses
import functools
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_fair.models import architectures
from tff_fair.models import names
from tff_fair.models import slimmable
from tff_fair.models import slimmable_models

KerasBuilder = Callable[[Optional[int]], tf.keras.Model]

# The plain architectures; the slimmable ones are slimmable_models.MODEL_NAMES.
MODEL_NAMES = names.PLAIN_MODELS

# Label of padding in sequence targets (TFF's Shakespeare pad id).
PAD_LABEL = 0


class MaskedSparseCategoricalCrossentropy(tf.keras.losses.Loss):
  """Mean cross-entropy over the labels that are not padding.

  Sequence targets are padded with `PAD_LABEL`; counting those positions
  would reward a model for predicting padding (a third of Shakespeare's
  targets are padding), so they carry no loss. `sample_weight` multiplies
  the mask.
  """

  def __init__(self, name: str = 'masked_sparse_categorical_crossentropy'):
    super().__init__(name=name)

  def __call__(self, y_true, y_pred, sample_weight=None):
    per_label = tf.keras.losses.sparse_categorical_crossentropy(
        y_true, y_pred, from_logits=True)
    mask = tf.cast(tf.not_equal(y_true, PAD_LABEL), per_label.dtype)
    if sample_weight is not None:
      mask *= tf.cast(sample_weight, per_label.dtype)
    return tf.math.divide_no_nan(tf.reduce_sum(per_label * mask),
                                 tf.reduce_sum(mask))


class MaskedSparseCategoricalAccuracy(
    tf.keras.metrics.SparseCategoricalAccuracy):
  """Accuracy over the labels that are not padding (`PAD_LABEL`)."""

  def update_state(self, y_true, y_pred, sample_weight=None):
    mask = tf.cast(tf.not_equal(y_true, PAD_LABEL), tf.float32)
    if sample_weight is not None:
      mask *= tf.cast(sample_weight, tf.float32)
    return super().update_state(y_true, y_pred, sample_weight=mask)


def loss_fn(masks_padding: bool = False) -> tf.keras.losses.Loss:
  """The loss every tff_fair model trains with (models output logits).

  Args:
    masks_padding: For sequence targets: ignore `PAD_LABEL` positions.
  """
  if masks_padding:
    return MaskedSparseCategoricalCrossentropy()
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def metrics_fn(masks_padding: bool = False) -> list[tf.keras.metrics.Metric]:
  """Training metrics; `masks_padding` as for `loss_fn`."""
  if masks_padding:
    return [MaskedSparseCategoricalAccuracy(name='accuracy')]
  return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A model architecture bound to the shape of one data set.

  Attributes:
    name: One of `MODEL_NAMES` or `slimmable_models.MODEL_NAMES`.
    build_keras: `seed -> tf.keras.Model`, a fresh uncompiled model that
      outputs logits. `seed=None` leaves initializers unseeded.
    input_spec: The batched element spec, `OrderedDict(x=..., y=...)`.
    masks_padding: Whether labels are padded sequences whose `PAD_LABEL`
      positions the loss and metrics ignore (as evaluation does).
    head_variables: The trainable variables of the output layer (kernel
      and bias), the last ones of the model: the head a client keeps of
      its own in FedRep (`parts.head`); the others are the body.
  """

  name: str
  build_keras: KerasBuilder
  input_spec: object
  masks_padding: bool = False
  head_variables: int = 2

  def model_fn(self) -> tff.learning.models.VariableModel:
    """Builds a fresh `VariableModel` (call inside each `model_fn`)."""
    return tff.learning.models.from_keras_model(
        self.build_keras(None),
        loss=loss_fn(self.masks_padding),
        input_spec=self.input_spec,
        metrics=metrics_fn(self.masks_padding),
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


# How each architecture reads a data set's shapes: the builder's arguments
# from (x_shape, num_classes, vocab_size).
def _image_arguments(x_shape, num_classes, vocab_size):
  del vocab_size  # Images have no vocabulary.
  return dict(input_shape=x_shape, num_classes=num_classes)


def _token_arguments(x_shape, num_classes, vocab_size):
  return dict(sequence_length=x_shape[0], vocab_size=vocab_size,
              num_classes=num_classes)


def _next_token_arguments(x_shape, num_classes, vocab_size):
  del num_classes  # One logit per vocabulary entry and position.
  return dict(sequence_length=x_shape[0], vocab_size=vocab_size)


# Name -> (builder taking `seed` and the data's arguments, those arguments).
_ARCHITECTURES = {
    'lenet': (architectures.lenet, _image_arguments),
    'cifar_cnn': (architectures.cifar_cnn, _image_arguments),
    'ditto_cnn': (functools.partial(architectures.two_conv_cnn,
                                    hidden_units=1024, padding='same'),
                  _image_arguments),
    'fedavg_cnn': (functools.partial(architectures.two_conv_cnn,
                                     hidden_units=512, padding='valid'),
                   _image_arguments),
    'mlp': (architectures.mlp, _image_arguments),
    'text_cnn': (architectures.text_cnn, _token_arguments),
    'char_lstm': (architectures.char_lstm, _next_token_arguments),
    'slimmable_lenet': (slimmable_models.lenet, _image_arguments),
    'slimmable_cifar_cnn': (slimmable_models.cifar_cnn, _image_arguments),
    'slimmable_ditto_cnn': (functools.partial(slimmable_models.two_conv_cnn,
                                              hidden_units=1024,
                                              padding='same'),
                            _image_arguments),
    'slimmable_fedavg_cnn': (functools.partial(slimmable_models.two_conv_cnn,
                                               hidden_units=512,
                                               padding='valid'),
                             _image_arguments),
    'slimmable_resnet18': (slimmable_models.resnet18, _image_arguments),
    'slimmable_text_cnn': (slimmable_models.text_cnn, _token_arguments),
}


def build_model_spec(
    name: str,
    *,
    x_shape: Sequence[int],
    x_dtype: tf.DType,
    y_shape: Sequence[int],
    num_classes: int,
    vocab_size: Optional[int] = None,
) -> ModelSpec:
  """Binds architecture `name`, plain or slimmable, to a data set's shapes.

  A slimmable architecture's input spec is that of `slimmable.with_width`
  batches: `OrderedDict(x=OrderedDict(features=..., width=float32 scalar),
  y=...)`.

  Args:
    name: One of `MODEL_NAMES` or `slimmable_models.MODEL_NAMES`.
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
  if name not in _ARCHITECTURES:
    raise ValueError(
        f'Unknown model {name!r}; choose one of {", ".join(_ARCHITECTURES)}.'
    )
  build, arguments = _ARCHITECTURES[name]
  if arguments is not _image_arguments and not vocab_size:
    raise ValueError(
        f'Model {name!r} reads token ids and needs vocab_size; the data set'
        ' does not provide one (is it a text data set?).'
    )
  bound = arguments(x_shape, num_classes, vocab_size)
  input_spec = batched_input_spec(x_shape, x_dtype, y_shape)
  if name in slimmable_models.MODEL_NAMES:
    input_spec = slimmable.input_spec_with_width(input_spec)
  return ModelSpec(
      name=name,
      build_keras=lambda seed: build(seed=seed, **bound),
      input_spec=input_spec,
      masks_padding=bool(len(y_shape)),
  )
