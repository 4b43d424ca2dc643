"""Slimmable versions of the reference architectures (Aequa).

Every builder returns a fresh, uncompiled `slimmable.SlimmableModel` with its
variables created (built at full width), outputting logits, taking
`slimmable.slimmable_inputs(features, width)` or bare features (full width);
see `tff_fair/models/slimmable.py` for the width contract. Width p keeps the
first ceil(p * C) channels of every hidden layer; the input channels (the
data's) and the logits (the classes) never change.

* `lenet`, `cifar_cnn`, `two_conv_cnn` (`ditto_cnn`, `fedavg_cnn`),
  `text_cnn`: the architectures of
  `architectures.py`, same variables in the same order and layout (weights
  are interchangeable with the reference models; at width 1 the outputs are
  the same). `lenet` and `cifar_cnn` take `norm_groups` to add GroupNorm
  after each convolution (convolutions then have no bias).
* `resnet18`: ResNet-18 for CIFAR-sized inputs (3x3 stem, no max-pool,
  stages of 64/128/256/512 channels, 2 basic blocks each, 1x1 projection
  shortcuts) with GroupNorm in place of BatchNorm: 11,173,962 parameters for
  10 classes, as the BatchNorm version's trainable ones.

Seeds are per layer, as in `architectures.py` (`architectures.layer_seeds`).
`model_fns.build_model_spec` binds these builders to a data set's shapes as
`ModelSpec`s whose input spec carries the width
(`OrderedDict(x=OrderedDict(features=..., width=[]), y=...)`), so
`spec.model_fn` works with `tff.learning` processes.
"""

from collections.abc import Callable, Sequence
import functools
from typing import Optional

import tensorflow as tf

from tff_fair.models import architectures
from tff_fair.models import names
from tff_fair.models import slimmable

MODEL_NAMES = names.SLIMMABLE_MODELS


def _conv_block(
    filters: int,
    kernel_size: int,
    padding: str,
    kernel_init,
    norm_groups: Optional[int],
    slim_input: bool,
) -> list[tf.keras.layers.Layer]:
  """Conv + ReLU, or Conv (no bias) + GroupNorm + ReLU."""
  if norm_groups is None:
    return [
        slimmable.SlimmableConv2D(
            filters, kernel_size, padding=padding, activation='relu',
            kernel_initializer=kernel_init, slim_input=slim_input,
        )
    ]
  return [
      slimmable.SlimmableConv2D(
          filters, kernel_size, padding=padding, use_bias=False,
          kernel_initializer=kernel_init, slim_input=slim_input,
      ),
      slimmable.SlimmableGroupNormalization(groups=norm_groups),
      tf.keras.layers.ReLU(),
  ]


def _conv_pool_dense(
    name: str,
    input_shape: Sequence[int],
    conv_filters: tuple[int, int],
    padding: str,
    dense_units: Sequence[int],
    num_classes: int,
    seed: Optional[int],
    norm_groups: Optional[int],
) -> slimmable.SlimmableModel:
  """Two 5x5 conv blocks each followed by 2x2 pooling, dense layers, logits."""
  layer_seed = architectures.layer_seeds(seed)
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=layer_seed(i))
  first, second = conv_filters
  layers = [
      *_conv_block(first, 5, padding, init(0), norm_groups, slim_input=False),
      tf.keras.layers.MaxPool2D(2, padding='same'),
      *_conv_block(second, 5, padding, init(1), norm_groups, slim_input=True),
      tf.keras.layers.MaxPool2D(2, padding='same'),
  ]
  for index, units in enumerate(dense_units):
    layers.append(slimmable.SlimmableDense(
        units, activation='relu', kernel_initializer=init(2 + index),
        flatten_input=index == 0,
    ))
  layers.append(slimmable.SlimmableDense(
      num_classes, kernel_initializer=init(2 + len(dense_units)),
      slim_output=False,
  ))
  model = slimmable.SlimmableSequential(
      layers, input_shape, tf.float32, name=name
  )
  return model.build_at_full_width()


def lenet(
    input_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
    seed: Optional[int] = None,
    norm_groups: Optional[int] = None,
) -> slimmable.SlimmableModel:
  """Slimmable LeNet-5: conv6-pool-conv16-pool-fc120-fc84-logits."""
  return _conv_pool_dense('slimmable_lenet', input_shape, (6, 16), 'same',
                          (120, 84), num_classes, seed, norm_groups)


def two_conv_cnn(
    input_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
    seed: Optional[int] = None,
    hidden_units: int = 1024,
    padding: str = 'same',
) -> slimmable.SlimmableModel:
  """Slimmable conv32 5x5 - pool - conv64 5x5 - pool - dense - logits.

  `architectures.two_conv_cnn`'s arguments: `ditto_cnn` is 'same' padding
  and 1024 hidden units, `fedavg_cnn` (PFLlib's FedAvgCNN) 'valid' and 512.
  """
  architectures.check_two_conv_input(input_shape, padding)
  return _conv_pool_dense('slimmable_two_conv_cnn', input_shape, (32, 64),
                          padding, (hidden_units,), num_classes, seed, None)


def cifar_cnn(
    input_shape: Sequence[int] = (32, 32, 3),
    num_classes: int = 10,
    seed: Optional[int] = None,
    norm_groups: Optional[int] = None,
) -> slimmable.SlimmableModel:
  """Slimmable CIFAR-10 CNN: conv32-pool-conv64-pool-conv64-fc64-logits."""
  layer_seed = architectures.layer_seeds(seed)
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=layer_seed(i))
  layers = [
      *_conv_block(32, 3, 'valid', init(0), norm_groups, slim_input=False),
      tf.keras.layers.MaxPool2D(2),
      *_conv_block(64, 3, 'valid', init(1), norm_groups, slim_input=True),
      tf.keras.layers.MaxPool2D(2),
      *_conv_block(64, 3, 'valid', init(2), norm_groups, slim_input=True),
      slimmable.SlimmableDense(
          64, activation='relu', kernel_initializer=init(3),
          flatten_input=True,
      ),
      slimmable.SlimmableDense(
          num_classes, kernel_initializer=init(4), slim_output=False
      ),
  ]
  model = slimmable.SlimmableSequential(
      layers, input_shape, tf.float32, name='slimmable_cifar_cnn'
  )
  return model.build_at_full_width()


class _TextCNN(slimmable.SlimmableModel):
  """Kim (2014) sentence CNN with slimmable embedding and filters."""

  def __init__(self, sequence_length, vocab_size, num_classes, embedding_dim,
               filters, kernel_sizes, seed):
    super().__init__((sequence_length,), tf.int32, name='slimmable_text_cnn')
    layer_seed = architectures.layer_seeds(seed)
    self.embedding = slimmable.SlimmableEmbedding(
        vocab_size,
        embedding_dim,
        embeddings_initializer=tf.keras.initializers.RandomUniform(
            -0.05, 0.05, seed=layer_seed(0)
        ),
    )
    self.convs = [
        slimmable.SlimmableConv1D(
            filters,
            size,
            activation='relu',
            padding='same',
            kernel_initializer=tf.keras.initializers.GlorotUniform(
                seed=layer_seed(i + 1)
            ),
        )
        for i, size in enumerate(kernel_sizes)
    ]
    self.pool = tf.keras.layers.GlobalMaxPool1D()
    # The pooled branches are stacked to [B, branches, filters]; flattening
    # gives the reference model's Concatenate layout.
    self.logits = slimmable.SlimmableDense(
        num_classes,
        kernel_initializer=tf.keras.initializers.GlorotUniform(
            seed=layer_seed(len(kernel_sizes) + 1)
        ),
        slim_output=False,
        flatten_input=True,
    )

  def forward(self, features, width, training=None):
    embedded = self.embedding(features, width=width)
    pooled = [self.pool(conv(embedded, width=width)) for conv in self.convs]
    return self.logits(tf.stack(pooled, axis=1), width=width)


def text_cnn(
    sequence_length: int,
    vocab_size: int,
    num_classes: int = 2,
    embedding_dim: int = 64,
    filters: int = 64,
    kernel_sizes: Sequence[int] = (3, 4, 5),
    seed: Optional[int] = None,
) -> slimmable.SlimmableModel:
  """Slimmable Kim-style sentence CNN over token ids (0 is padding)."""
  model = _TextCNN(sequence_length, vocab_size, num_classes, embedding_dim,
                   filters, tuple(kernel_sizes), seed)
  return model.build_at_full_width()


class SlimmableBasicBlock(tf.keras.layers.Layer):
  """ResNet basic block (two 3x3 convs) with GroupNorm; all slimmable."""

  def __init__(self, planes: int, stride: int, projection: bool,
               norm_groups: int, initializer: Callable[[], object], **kwargs):
    super().__init__(**kwargs)
    conv = functools.partial(
        slimmable.SlimmableConv2D, padding='same', use_bias=False
    )
    norm = lambda: slimmable.SlimmableGroupNormalization(
        groups=min(norm_groups, planes)
    )
    self.conv1 = conv(planes, 3, strides=stride,
                      kernel_initializer=initializer())
    self.norm1 = norm()
    self.conv2 = conv(planes, 3, kernel_initializer=initializer())
    self.norm2 = norm()
    if projection:
      self.shortcut_conv = conv(planes, 1, strides=stride,
                                kernel_initializer=initializer())
      self.shortcut_norm = norm()
    else:
      self.shortcut_conv = self.shortcut_norm = None

  def call(self, inputs, width=None):
    y = tf.nn.relu(self.norm1(self.conv1(inputs, width=width), width=width))
    y = self.norm2(self.conv2(y, width=width), width=width)
    shortcut = inputs
    if self.shortcut_conv is not None:
      shortcut = self.shortcut_norm(
          self.shortcut_conv(inputs, width=width), width=width
      )
    return tf.nn.relu(y + shortcut)


class _ResNet18(slimmable.SlimmableModel):
  """CIFAR ResNet-18 with GroupNorm."""

  STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))

  def __init__(self, input_shape, num_classes, norm_groups, seed):
    super().__init__(tuple(input_shape), tf.float32, name='slimmable_resnet18')
    layer_seed = architectures.layer_seeds(seed)
    counter = iter(range(1_000))
    he = lambda: tf.keras.initializers.HeNormal(seed=layer_seed(next(counter)))
    self.stem = slimmable.SlimmableConv2D(
        64, 3, padding='same', use_bias=False, kernel_initializer=he(),
        slim_input=False,
    )
    self.stem_norm = slimmable.SlimmableGroupNormalization(
        groups=min(norm_groups, 64)
    )
    self.blocks = []
    in_planes = 64
    for stage, (planes, stride) in enumerate(self.STAGES):
      for index in range(2):
        block_stride = stride if index == 0 else 1
        self.blocks.append(
            SlimmableBasicBlock(
                planes,
                block_stride,
                projection=block_stride != 1 or in_planes != planes,
                norm_groups=norm_groups,
                initializer=he,
                name=f'stage{stage + 1}_block{index + 1}',
            )
        )
        in_planes = planes
    self.pool = tf.keras.layers.GlobalAveragePooling2D()
    self.logits = slimmable.SlimmableDense(
        num_classes,
        kernel_initializer=tf.keras.initializers.GlorotUniform(
            seed=layer_seed(next(counter))
        ),
        slim_output=False,
    )

  def forward(self, features, width, training=None):
    x = tf.nn.relu(
        self.stem_norm(self.stem(features, width=width), width=width)
    )
    for block in self.blocks:
      x = block(x, width=width)
    return self.logits(self.pool(x), width=width)


def resnet18(
    input_shape: Sequence[int] = (32, 32, 3),
    num_classes: int = 10,
    seed: Optional[int] = None,
    norm_groups: int = 32,
) -> slimmable.SlimmableModel:
  """Slimmable CIFAR ResNet-18 with GroupNorm (`norm_groups` at full width).

  The group size is fixed per layer (`channels / norm_groups`: 2 channels in
  the 64-channel stage, 16 in the 512-channel one).
  """
  model = _ResNet18(input_shape, num_classes, norm_groups, seed)
  return model.build_at_full_width()

