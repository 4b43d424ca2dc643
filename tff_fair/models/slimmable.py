"""Slimmable Keras layers whose width is a runtime tensor.

One model, one set of full-width variables, any width p in (0, 1]: width p
keeps the first `ceil(p * C)` channels (units, filters, embedding dimensions)
of every hidden layer, a nested prefix, so width p's sub-network is contained
in every wider one (Aequa, Tastan et al. 2025; Yu et al. 2019). The width is
an ordinary float32 tensor fed with the data, so one traced `tf.function` or
TFF computation serves every width (TFF types are static: the full-width
weights always travel, only the compute shrinks).

Width contract (what the Aequa process builds on)
-------------------------------------------------
A `SlimmableModel` is called with

* `OrderedDict(features=<batch>, width=<float32 scalar>)` (see
  `slimmable_inputs`); a `(features, width)` pair is accepted too;
* or the bare features, which run the full width (p = 1), so evaluation code
  that feeds `batch['x']` of an ordinary data set keeps working.

For `tff.learning.models.from_keras_model` a batch is therefore
`OrderedDict(x=OrderedDict(features=x, width=p), y=y)`: `with_width(batch, p)`
builds it (use it in `dataset.map` after `batch`, or inside client work on a
width that is itself a computation argument or a `tf.random.uniform` draw),
and `input_spec_with_width(spec)` turns an ordinary `OrderedDict(x=..., y=...)`
input spec into the matching one. The width is one scalar per batch; a
per-example vector (width attached before batching) is accepted when all its
entries are equal (checked) and reduced to a scalar. Keep the key names:
tff.learning counts examples from the first tensor of `tf.nest.flatten(x)`,
and 'features' sorts before 'width'.

Width checks: a width outside (0, 1] (or NaN) raises `ValueError` when its
value is known at trace time (eager calls, constants) and fails a
`tf.debugging` assertion (`InvalidArgumentError`) when it is a graph tensor.
A model checks its width once per call (its layers then trust it); a layer
called on its own checks the width it gets.
The model does not enforce Aequa's p_min: that is the algorithm's choice;
every hidden layer keeps at least one channel at any width.

Active sizes: `active_size(p, C) = clip(ceil(p * C - 1e-6 * C), 1, C)`,
computed in float64 from the float32 width so rounding never adds a channel
(0.5 * 64 is 32, 0.3 * 10 is 3); `active_size_py` is the same in Python.

Layers
------
`SlimmableDense`, `SlimmableConv1D`, `SlimmableConv2D`, `SlimmableEmbedding`
and `SlimmableGroupNormalization` are called as `layer(x, width=p)`
(`width=None` is the full width). Flags:

* `slim_input` (Dense, Conv): the input's channels follow the width. False
  for a layer reading the data (its input channels are the data's).
* `slim_output` (Dense, Conv, Embedding): the outputs follow the width. False
  for the logits layer (outputs are the classes).
* `flatten_input` (Dense): the input `[B, d1, ..., dk, C]` is flattened (as
  `Flatten()` then `Dense`) with C the slimmable channel axis; the kernel
  keeps Keras' `Flatten` layout, rows of channel c >= active at every
  position are skipped. Also used for concatenated branches: stack them
  to `[B, branches, C]`.

Narrow widths compute less: kernels (and biases, GroupNorm scales) are
SLICED to `[..., :active_in, :active_out]` with a size that is a Python int
when the width is known at trace time (static shapes) and a tensor otherwise
(dynamic channel dimensions, static rank); the matmul / convolution runs on
the sliced operands. Nothing is masked. The embedding gathers full rows then
slices them (cost proportional to the tokens, not the vocabulary; a lookup
is not compute). Channels beyond the width get exactly zero gradient (the
gradient of a slice). Every layer records the actual sliced shapes of its
last call whose sizes were static in `layer.last_active` (`kernel_shape`,
`macs` per example), which is how tests see the smaller kernels.

A slimmable layer is built from the static shape of its first input, which
must be the full width: the model builders call every model once at p = 1
(`SlimmableModel.build_at_full_width`) before returning it. Weights move as
lists (`get_weights`/`set_weights`, TFF `ModelWeights`, the same order and
shapes as the reference models); the layers define no `get_config`, so
Keras whole-model saving is not supported.

Normalization: GroupNorm, not BatchNorm
---------------------------------------
BatchNorm's running statistics differ per width (the sliced layer before it
has different outputs at every width), so slimmable networks need one BN per
width (switchable BN), which a continuous width in [p_min, 1] cannot have,
or HeteroFL's static BN (statistics recomputed after training). TFF also
warns that BN statistics are not aggregated. GroupNorm has no running
statistics: it normalizes every example by the statistics of its own active
channels, identically in training and evaluation and at every width.
Groups have a fixed SIZE (`C / groups` at full width): channel c is always
in group `c // group_size`, so a width keeps whole groups and drops trailing
ones; a width whose active channel count is not a multiple of the group
size leaves its last group partial, normalized over its active channels only
(`tf.nn.weighted_moments` with a 0/1 channel mask, as Keras' GroupNorm does
for masks). With fixed NUMBER of groups instead,
the same channel would move between groups as the width changes.

No HeteroFL-style output scaler (1/p) is applied: Aequa trains every width
(the full width plus a sampled one in each step), so the shared weights are
fitted to every width's sums; in models with GroupNorm the normalization
also removes the scale change of a narrower sum.

Per-coordinate masks: `variable_masks(model, p)` gives, aligned with
`model.trainable_variables`, 0/1 masks of the coordinates width p uses (in
TF, so it works on a graph width), e.g. to average each coordinate only over
the clients that trained it; `active_parameter_count(model, p)` and
`multiply_accumulates(model, p)` report size and compute of a width.
"""

import collections
from collections.abc import Mapping, Sequence
import contextlib
import math
import threading
from typing import Any, Optional, Union

import numpy as np
import tensorflow as tf

FEATURES_KEY = 'features'
WIDTH_KEY = 'width'

Width = Union[float, tf.Tensor]
Size = Union[int, tf.Tensor]


# ----------------------------------------------------------------------------
# Width arithmetic and checks.


def _tolerance(full_size: int) -> float:
  return 1e-6 * full_size


def active_size_py(width: float, full_size: int) -> int:
  """Channels of a layer of `full_size` kept at `width` (Python ints)."""
  if full_size < 1:
    raise ValueError(f'A slimmable layer needs >= 1 channel, got {full_size}.')
  w = float(np.float32(width))
  n = math.ceil(w * full_size - _tolerance(full_size))
  return min(max(n, 1), full_size)


# Widths given as plain numbers (known when a function is traced).
_NUMBER_TYPES = (int, float, np.floating, np.integer)


def _static_value(width: Width) -> Optional[float]:
  if isinstance(width, _NUMBER_TYPES):
    return float(width)
  value = tf.get_static_value(width)
  if value is None or np.ndim(value) != 0:
    return None
  return float(value)


def active_size(width: Width, full_size: int) -> Size:
  """`active_size_py` for a width tensor: an int if the width is static."""
  static = _static_value(width)
  if static is not None:
    return active_size_py(static, full_size)
  w = tf.cast(width, tf.float64)
  n = tf.cast(
      tf.math.ceil(w * float(full_size) - _tolerance(full_size)), tf.int32
  )
  return tf.clip_by_value(n, 1, full_size)


def _width_error(value) -> ValueError:
  return ValueError(
      f'Slimmable width must be in (0, 1] (1 is the full model), got {value}.'
  )


def check_width(width: Width) -> tf.Tensor:
  """Returns `width` as a checked float32 scalar tensor.

  Args:
    width: A number or float tensor in (0, 1]; a tensor of any shape whose
      entries are all equal (a per-example width) is reduced to a scalar.

  Returns:
    A float32 scalar. A constant if the value is known at trace time.

  Raises:
    ValueError: For a known width outside (0, 1], NaN, unequal entries or an
      empty width tensor.
    tf.errors.InvalidArgumentError: At run time for a graph width that fails
      the same checks.
  """
  width = tf.convert_to_tensor(width)
  if not width.dtype.is_floating:
    width = tf.cast(width, tf.float32)
  elif width.dtype != tf.float32:
    width = tf.cast(width, tf.float32)
  if width.shape.rank != 0:
    static = tf.get_static_value(width)
    if static is not None:
      flat = np.reshape(static, [-1])
      if flat.size == 0:
        raise ValueError('Slimmable width tensor is empty.')
      if not np.all(flat == flat[0]):
        raise ValueError(
            'A batch runs at one width; got different widths'
            f' {np.unique(flat)[:5]}.'
        )
      width = tf.constant(flat[0], tf.float32)
    else:
      flat = tf.reshape(width, [-1])
      with tf.control_dependencies([
          tf.debugging.assert_equal(
              tf.reduce_min(flat),
              tf.reduce_max(flat),
              message='A batch runs at one width; got different widths.',
          )
      ]):
        width = tf.identity(flat[0])
  static = _static_value(width)
  if static is not None:
    if not 0.0 < static <= 1.0:
      raise _width_error(static)
    return tf.constant(static, tf.float32)
  message = 'Slimmable width must be in (0, 1] (1 is the full model).'
  with tf.control_dependencies([
      tf.debugging.assert_greater(width, 0.0, message=message),
      tf.debugging.assert_less_equal(width, 1.0, message=message),
  ]):
    return tf.identity(width)


_checked = threading.local()


@contextlib.contextmanager
def _width_checked_by_model():
  """Within a `SlimmableModel` call the width is checked once, up front."""
  previous = getattr(_checked, 'active', False)
  _checked.active = True
  try:
    yield
  finally:
    _checked.active = previous


def _width_or_full(width: Optional[Width]) -> tf.Tensor:
  if width is None:
    return tf.constant(1.0)
  if getattr(_checked, 'active', False) and isinstance(width, tf.Tensor):
    return width
  return check_width(width)


# ----------------------------------------------------------------------------
# The input contract.


def slimmable_inputs(features, width: Width) -> collections.OrderedDict:
  """The model input for `features` at `width`."""
  return collections.OrderedDict([(FEATURES_KEY, features), (WIDTH_KEY, width)])


def split_inputs(inputs) -> tuple[Any, Optional[Width]]:
  """`(features, width)` of a model input; width None means full width."""
  if isinstance(inputs, Mapping):
    if FEATURES_KEY not in inputs:
      raise KeyError(
          f'A slimmable model input mapping needs key {FEATURES_KEY!r} (and'
          f' {WIDTH_KEY!r}); got keys {list(inputs)}.'
      )
    return inputs[FEATURES_KEY], inputs.get(WIDTH_KEY)
  if isinstance(inputs, (tuple, list)):
    if len(inputs) != 2:
      raise ValueError(
          'A slimmable model input sequence must be (features, width); got'
          f' {len(inputs)} elements.'
      )
    return inputs[0], inputs[1]
  return inputs, None


def with_width(batch, width: Width) -> collections.OrderedDict:
  """`OrderedDict(x, y)` -> `OrderedDict(x=OrderedDict(features, width), y)`.

  For `tff.learning` data sets: `dataset.batch(b).map(lambda e:
  with_width(e, p))` (a data set stores the width as a float32 scalar). A
  width tensor is cast to a float32 scalar; a Python number stays a Python
  float, so a `tf.function` the batch is passed to (TFF's Keras wrapper runs
  the model in one) traces it as a constant, with static shapes. A tensor
  there, even a constant one, is a placeholder: every kernel is sliced with
  sizes known only at run time (docs/benchmarks.md, *Slimmable step time*,
  measures what that costs Aequa's full-width pass).
  """
  if isinstance(batch, Mapping):
    x, y = batch['x'], batch['y']
  else:
    x, y = batch
  if isinstance(width, _NUMBER_TYPES):
    width = float(width)
  else:
    width = tf.cast(width, tf.float32)
  return collections.OrderedDict(x=slimmable_inputs(x, width), y=y)


def input_spec_with_width(input_spec) -> collections.OrderedDict:
  """The `with_width` counterpart of an `OrderedDict(x=..., y=...)` spec."""
  if isinstance(input_spec, Mapping):
    x, y = input_spec['x'], input_spec['y']
  else:
    x, y = input_spec
  return collections.OrderedDict(
      x=slimmable_inputs(x, tf.TensorSpec([], tf.float32)), y=y
  )


# ----------------------------------------------------------------------------
# Layers.


def _is_full(size: Size, full: int) -> bool:
  return isinstance(size, int) and size == full


def _is_static(*sizes: Size) -> bool:
  return all(isinstance(s, int) for s in sizes)


def _prefix_mask(size: Size, full: int) -> tf.Tensor:
  return tf.sequence_mask(size, full, dtype=tf.float32)


def _leading(value: tf.Tensor, *sizes: Size) -> tf.Tensor:
  """`value[..., :sizes[0], ..., :sizes[-1]]` on its last `len(sizes)` axes.

  Built with `tf.slice`, whose gradient is one `Pad`, not a strided slice
  (whose gradient, `StridedSliceGrad`, is the more general scatter). Same
  values either way.
  """
  rank = value.shape.rank
  if _is_static(*sizes):
    return tf.slice(value, [0] * rank, [-1] * (rank - len(sizes)) + [*sizes])
  size = tf.stack([-1] * (rank - len(sizes))
                  + [tf.cast(s, tf.int32) for s in sizes])
  sliced = tf.slice(value, [0] * rank, size)
  # A size tensor hides the leading axes' static sizes; keep them.
  sliced.set_shape(value.shape[:rank - len(sizes)].concatenate(
      [s if isinstance(s, int) else None for s in sizes]))
  return sliced


def _static_channels(layer: tf.keras.layers.Layer, input_shape) -> int:
  channels = tf.compat.dimension_value(tf.TensorShape(input_shape)[-1])
  if channels is None:
    raise ValueError(
        f'{type(layer).__name__} {layer.name!r} is built from its first'
        ' input, whose last (channel) dimension must be static and full'
        f' width; got shape {input_shape}. Call the layer (or model) at'
        ' width 1.0 first (SlimmableModel.build_at_full_width).'
    )
  return channels


class SlimmableLayer(tf.keras.layers.Layer):
  """Base of the slimmable layers: width-dependent active sizes.

  Subclasses set `self.in_channels` (full input channels) and `self.units`
  (full outputs) in `build` and implement `_variable_layout`, mapping each
  variable to the axes that follow the input and the output width.
  """

  def __init__(self, slim_input: bool = True, slim_output: bool = True,
               **kwargs):
    super().__init__(**kwargs)
    self.slim_input = bool(slim_input)
    self.slim_output = bool(slim_output)
    self.last_active: Optional[dict[str, Any]] = None

  def _add_kernel_and_bias(self, kernel_shape: list[int]) -> None:
    """Creates `kernel` (full width) and, with `use_bias`, `bias`."""
    self.kernel = self.add_weight(
        'kernel', shape=kernel_shape, initializer=self.kernel_initializer,
        dtype=self.dtype, trainable=True)
    self.bias = self.add_weight(
        'bias', shape=[self.units], initializer=self.bias_initializer,
        dtype=self.dtype, trainable=True) if self.use_bias else None

  def active_sizes(self, width: Width) -> tuple[Size, Size]:
    """(input channels, outputs) active at `width`."""
    ci = (
        active_size(width, self.in_channels)
        if self.slim_input
        else self.in_channels
    )
    co = active_size(width, self.units) if self.slim_output else self.units
    return ci, co

  def _check_input(self, inputs: tf.Tensor, ci: Size) -> None:
    got = tf.compat.dimension_value(inputs.shape[-1])
    if isinstance(ci, int) and got is not None and got != ci:
      raise ValueError(
          f'{type(self).__name__} {self.name!r} expects {ci} input channels'
          f' at this width (slim_input={self.slim_input}, full'
          f' {self.in_channels}), got {got} (input shape {inputs.shape}).'
      )

  def _variable_layout(self) -> list[tuple[tf.Variable, Any]]:
    """[(variable, mask_fn(ci, co) -> 0/1 mask of the variable's shape)]."""
    raise NotImplementedError

  def variable_masks(self, width: Width) -> list[tuple[tf.Variable, tf.Tensor]]:
    """0/1 float32 masks of the coordinates `width` uses, per variable."""
    ci, co = self.active_sizes(width)
    return [(v, fn(ci, co)) for v, fn in self._variable_layout()]

  def active_parameter_count(self, width: float) -> int:
    ci, co = self.active_sizes(float(width))
    return int(
        sum(np.sum(fn(ci, co).numpy()) for _, fn in self._variable_layout())
    )

  def _record(self, kernel_shape: tuple[Size, ...],
              macs: Optional[int]) -> None:
    """Keeps the sliced sizes of this call if they are static."""
    if _is_static(*kernel_shape):
      self.last_active = dict(kernel_shape=kernel_shape, macs=macs)


class SlimmableDense(SlimmableLayer):
  """`Dense` whose inputs and units follow the width (see module docstring)."""

  def __init__(
      self,
      units: int,
      activation=None,
      use_bias: bool = True,
      kernel_initializer='glorot_uniform',
      bias_initializer='zeros',
      slim_input: bool = True,
      slim_output: bool = True,
      flatten_input: bool = False,
      **kwargs,
  ):
    super().__init__(slim_input=slim_input, slim_output=slim_output, **kwargs)
    self.units = int(units)
    self.activation = tf.keras.activations.get(activation)
    self.use_bias = use_bias
    self.kernel_initializer = tf.keras.initializers.get(kernel_initializer)
    self.bias_initializer = tf.keras.initializers.get(bias_initializer)
    self.flatten_input = flatten_input

  def build(self, input_shape):
    input_shape = tf.TensorShape(input_shape)
    self.in_channels = _static_channels(self, input_shape)
    if self.flatten_input:
      positions = input_shape[1:-1]
      if not positions.is_fully_defined():
        raise ValueError(
            f'SlimmableDense {self.name!r} with flatten_input needs static'
            f' non-batch dimensions, got {input_shape}.'
        )
      self.positions = int(np.prod(positions.as_list(), dtype=np.int64))
    else:
      self.positions = 1
    self._add_kernel_and_bias([self.positions * self.in_channels, self.units])
    super().build(input_shape)

  def _sliced_kernel(self, ci: Size, co: Size) -> tf.Tensor:
    if _is_full(ci, self.in_channels) and _is_full(co, self.units):
      return tf.convert_to_tensor(self.kernel)
    if self.positions == 1:
      return _leading(self.kernel, ci, co)
    blocks = _leading(
        tf.reshape(
            self.kernel, [self.positions, self.in_channels, self.units]
        ),
        ci, co,
    )
    return tf.reshape(blocks, [self.positions * ci, co])

  def _variable_layout(self):
    def kernel_mask(ci, co):
      rows = tf.tile(_prefix_mask(ci, self.in_channels), [self.positions])
      return rows[:, None] * _prefix_mask(co, self.units)[None, :]

    layout = [(self.kernel, kernel_mask)]
    if self.use_bias:
      layout.append((self.bias, lambda ci, co: _prefix_mask(co, self.units)))
    return layout

  def call(self, inputs, width=None):
    width = _width_or_full(width)
    ci, co = self.active_sizes(width)
    if inputs.dtype.base_dtype != self.compute_dtype:
      inputs = tf.cast(inputs, self.compute_dtype)
    self._check_input(inputs, ci)
    kernel = self._sliced_kernel(ci, co)
    if self.flatten_input:
      inputs = tf.reshape(inputs, [-1, self.positions * ci])
    rank = inputs.shape.rank
    if rank == 2:
      outputs = tf.matmul(inputs, kernel)
    else:
      outputs = tf.tensordot(inputs, kernel, [[rank - 1], [0]])
    if self.use_bias:
      bias = self.bias if _is_full(co, self.units) else _leading(self.bias, co)
      outputs = tf.nn.bias_add(outputs, bias)
    if self.activation is not None:
      outputs = self.activation(outputs)
    self._record(
        kernel_shape=(self.positions * ci if _is_static(ci) else ci, co),
        macs=self.positions * ci * co if _is_static(ci, co) else None,
    )
    return outputs


class _SlimmableConv(SlimmableLayer):
  """Shared N-d convolution (channels last, 'valid' or 'same' padding)."""

  _rank: int = 0
  _data_format: str = ''

  def __init__(
      self,
      filters: int,
      kernel_size,
      strides=1,
      padding: str = 'valid',
      dilation_rate=1,
      activation=None,
      use_bias: bool = True,
      kernel_initializer='glorot_uniform',
      bias_initializer='zeros',
      slim_input: bool = True,
      slim_output: bool = True,
      **kwargs,
  ):
    super().__init__(slim_input=slim_input, slim_output=slim_output, **kwargs)
    self.units = int(filters)
    self.kernel_size = self._tuple(kernel_size, 'kernel_size')
    self.strides = self._tuple(strides, 'strides')
    self.dilation_rate = self._tuple(dilation_rate, 'dilation_rate')
    padding = padding.lower()
    if padding not in ('valid', 'same'):
      raise ValueError(f"padding must be 'valid' or 'same', got {padding!r}.")
    self.padding = padding
    self.activation = tf.keras.activations.get(activation)
    self.use_bias = use_bias
    self.kernel_initializer = tf.keras.initializers.get(kernel_initializer)
    self.bias_initializer = tf.keras.initializers.get(bias_initializer)

  @property
  def filters(self) -> int:
    return self.units

  def _tuple(self, value, name) -> tuple[int, ...]:
    if isinstance(value, int):
      return (value,) * self._rank
    value = tuple(int(v) for v in value)
    if len(value) != self._rank:
      raise ValueError(f'{name} needs {self._rank} values, got {value}.')
    return value

  def build(self, input_shape):
    input_shape = tf.TensorShape(input_shape)
    if input_shape.rank != self._rank + 2:
      raise ValueError(
          f'{type(self).__name__} expects rank-{self._rank + 2} inputs, got'
          f' shape {input_shape}.'
      )
    self.in_channels = _static_channels(self, input_shape)
    self._add_kernel_and_bias([*self.kernel_size, self.in_channels, self.units])
    super().build(input_shape)

  def _variable_layout(self):
    def kernel_mask(ci, co):
      mask = (
          _prefix_mask(ci, self.in_channels)[:, None]
          * _prefix_mask(co, self.units)[None, :]
      )
      return tf.broadcast_to(mask, self.kernel.shape)

    layout = [(self.kernel, kernel_mask)]
    if self.use_bias:
      layout.append((self.bias, lambda ci, co: _prefix_mask(co, self.units)))
    return layout

  def call(self, inputs, width=None):
    width = _width_or_full(width)
    ci, co = self.active_sizes(width)
    if inputs.dtype.base_dtype != self.compute_dtype:
      inputs = tf.cast(inputs, self.compute_dtype)
    self._check_input(inputs, ci)
    if _is_full(ci, self.in_channels) and _is_full(co, self.units):
      kernel = tf.convert_to_tensor(self.kernel)
    else:
      kernel = _leading(self.kernel, ci, co)
    outputs = tf.nn.convolution(
        inputs,
        kernel,
        strides=list(self.strides),
        padding=self.padding.upper(),
        dilations=list(self.dilation_rate),
        data_format=self._data_format,
        name=type(self).__name__,
    )
    if self.use_bias:
      bias = self.bias if _is_full(co, self.units) else _leading(self.bias, co)
      outputs = tf.nn.bias_add(outputs, bias, data_format=self._data_format)
    if self.activation is not None:
      outputs = self.activation(outputs)
    positions = outputs.shape[1:-1]
    self._record(
        kernel_shape=(*self.kernel_size, ci, co),
        macs=(
            int(np.prod(positions.as_list()))
            * int(np.prod(self.kernel_size))
            * ci
            * co
            if _is_static(ci, co) and positions.is_fully_defined()
            else None
        ),
    )
    return outputs


class SlimmableConv1D(_SlimmableConv):
  """`Conv1D` (channels last) whose channels follow the width."""

  _rank = 1
  _data_format = 'NWC'


class SlimmableConv2D(_SlimmableConv):
  """`Conv2D` (channels last) whose channels follow the width."""

  _rank = 2
  _data_format = 'NHWC'


class SlimmableEmbedding(SlimmableLayer):
  """`Embedding` whose output dimensions follow the width.

  Looks the full rows up, then slices them: the cost is proportional to the
  number of tokens, and the gradient stays sparse (`IndexedSlices`) with
  zeros beyond the width.
  """

  def __init__(
      self,
      input_dim: int,
      output_dim: int,
      embeddings_initializer='uniform',
      slim_output: bool = True,
      **kwargs,
  ):
    super().__init__(slim_input=False, slim_output=slim_output, **kwargs)
    self.input_dim = int(input_dim)
    self.units = int(output_dim)
    self.in_channels = self.input_dim
    self.embeddings_initializer = tf.keras.initializers.get(
        embeddings_initializer
    )

  @property
  def output_dim(self) -> int:
    return self.units

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        'embeddings',
        shape=[self.input_dim, self.units],
        initializer=self.embeddings_initializer,
        dtype=self.dtype,
        trainable=True,
    )
    super().build(input_shape)

  def _variable_layout(self):
    def mask(ci, co):
      del ci
      return tf.broadcast_to(
          _prefix_mask(co, self.units)[None, :], self.embeddings.shape
      )

    return [(self.embeddings, mask)]

  def call(self, inputs, width=None):
    width = _width_or_full(width)
    _, co = self.active_sizes(width)
    if inputs.dtype not in (tf.int32, tf.int64):
      inputs = tf.cast(inputs, tf.int32)
    outputs = tf.nn.embedding_lookup(self.embeddings, inputs)
    if not _is_full(co, self.units):
      outputs = _leading(outputs, co)
    self._record(kernel_shape=(self.input_dim, co), macs=0)
    return outputs


class SlimmableGroupNormalization(SlimmableLayer):
  """GroupNorm over the active channels, with a fixed group SIZE.

  Give `groups` (the number at full width; must divide the channels) or
  `group_size`. Channel c is in group `c // group_size` at every width; a
  partial last group is normalized over its active channels. Matches
  `tf.keras.layers.GroupNormalization(groups=active // group_size)` when the
  active channels are a multiple of the group size.
  """

  def __init__(
      self,
      groups: Optional[int] = None,
      group_size: Optional[int] = None,
      epsilon: float = 1e-3,
      center: bool = True,
      scale: bool = True,
      beta_initializer='zeros',
      gamma_initializer='ones',
      **kwargs,
  ):
    super().__init__(slim_input=True, slim_output=True, **kwargs)
    if (groups is None) == (group_size is None):
      raise ValueError('Give exactly one of groups and group_size.')
    self.groups = groups
    self.group_size = group_size
    self.epsilon = epsilon
    self.center = center
    self.scale = scale
    self.beta_initializer = tf.keras.initializers.get(beta_initializer)
    self.gamma_initializer = tf.keras.initializers.get(gamma_initializer)

  def build(self, input_shape):
    input_shape = tf.TensorShape(input_shape)
    if input_shape.rank is None or input_shape.rank < 2:
      raise ValueError(f'GroupNorm needs rank >= 2 inputs, got {input_shape}.')
    channels = _static_channels(self, input_shape)
    if self.group_size is None:
      if channels % self.groups:
        raise ValueError(
            f'groups={self.groups} must divide the {channels} channels.'
        )
      self.group_size = channels // self.groups
    self.in_channels = self.units = channels
    self.gamma = (
        self.add_weight(
            'gamma', shape=[channels], initializer=self.gamma_initializer,
            dtype=self.dtype, trainable=True,
        )
        if self.scale
        else None
    )
    self.beta = (
        self.add_weight(
            'beta', shape=[channels], initializer=self.beta_initializer,
            dtype=self.dtype, trainable=True,
        )
        if self.center
        else None
    )
    super().build(input_shape)

  def _variable_layout(self):
    mask = lambda ci, co: _prefix_mask(co, self.units)
    return [(v, mask) for v in (self.gamma, self.beta) if v is not None]

  def call(self, inputs, width=None):
    width = _width_or_full(width)
    _, ca = self.active_sizes(width)
    self._check_input(inputs, ca)
    gs = self.group_size
    rank = inputs.shape.rank
    if _is_static(ca):
      num_groups = -(-ca // gs)
    else:
      num_groups = (ca + gs - 1) // gs
    padded = num_groups * gs
    pad = padded - ca
    no_pad = _is_static(ca) and pad == 0
    x = inputs
    if not no_pad:
      x = tf.pad(x, [[0, 0]] * (rank - 1) + [[0, pad]])
    shape = tf.shape(x)
    grouped_shape = tf.concat(
        [shape[:-1], tf.stack([num_groups, gs])], axis=0
    )
    grouped = tf.reshape(x, grouped_shape)
    weights_shape = [1] * (rank - 1) + [num_groups, gs]
    mask = tf.reshape(
        _prefix_mask(ca, padded) if not no_pad else tf.ones([padded]),
        tf.stack(weights_shape),
    )
    axes = list(range(1, rank - 1)) + [rank]
    mean, variance = tf.nn.weighted_moments(
        grouped, axes=axes, frequency_weights=tf.cast(mask, x.dtype),
        keepdims=True,
    )

    def per_channel(v):
      if v is None:
        return None
      v = v if _is_full(ca, self.units) else _leading(v, ca)
      if not no_pad:
        v = tf.pad(v, [[0, pad]])
      return tf.reshape(v, tf.stack(weights_shape))

    normalized = tf.nn.batch_normalization(
        grouped,
        mean=mean,
        variance=variance,
        offset=per_channel(self.beta),
        scale=per_channel(self.gamma),
        variance_epsilon=self.epsilon,
    )
    outputs = tf.reshape(normalized, shape)
    if not no_pad:
      outputs = _leading(outputs, ca)
    self._record(kernel_shape=(ca,), macs=0)
    return outputs


SLIMMABLE_LAYERS = (
    SlimmableDense,
    SlimmableConv1D,
    SlimmableConv2D,
    SlimmableEmbedding,
    SlimmableGroupNormalization,
)


# ----------------------------------------------------------------------------
# Models.


class SlimmableModel(tf.keras.Model):
  """A Keras model taking `slimmable_inputs(features, width)` (see above).

  Subclasses implement `forward(features, width, training)`, calling their
  slimmable layers as `layer(x, width=width)`.
  """

  def __init__(self, feature_shape: Sequence[int],
               feature_dtype: tf.DType = tf.float32, **kwargs):
    super().__init__(**kwargs)
    self._feature_shape = tuple(int(d) for d in feature_shape)
    self._feature_dtype = tf.as_dtype(feature_dtype)

  @property
  def feature_spec(self) -> tf.TensorSpec:
    """Spec of a batch of features (without the width)."""
    return tf.TensorSpec([None, *self._feature_shape], self._feature_dtype)

  def input_spec_with_width(self) -> collections.OrderedDict:
    """Spec of the model input: `OrderedDict(features=..., width=[])`."""
    return slimmable_inputs(
        self.feature_spec, tf.TensorSpec([], tf.float32)
    )

  def call(self, inputs, training=None):
    features, width = split_inputs(inputs)
    width = _width_or_full(width)
    with _width_checked_by_model():
      return self.forward(features, width, training=training)

  def forward(self, features, width: tf.Tensor, training=None):
    raise NotImplementedError

  def build_at_full_width(self) -> 'SlimmableModel':
    """Creates the variables by one call at width 1 on a dummy batch."""
    # In eager mode the call is traced in a scratch graph (variables are
    # lifted out by Keras); in graph mode (e.g. inside a TFF model_fn) the
    # unused ops stay in the caller's graph.
    scope = (
        tf.__internal__.FuncGraph('slimmable_build').as_default()
        if tf.executing_eagerly()
        else contextlib.nullcontext()
    )
    with scope:
      self(
          slimmable_inputs(
              tf.zeros([1, *self._feature_shape], self._feature_dtype),
              tf.constant(1.0),
          )
      )
    return self


class SlimmableSequential(SlimmableModel):
  """A stack of layers; slimmable ones get the width, others only `x`."""

  def __init__(self, layers: Sequence[tf.keras.layers.Layer],
               feature_shape: Sequence[int],
               feature_dtype: tf.DType = tf.float32, **kwargs):
    super().__init__(feature_shape, feature_dtype, **kwargs)
    self.stack = list(layers)

  def forward(self, features, width, training=None):
    x = features
    for layer in self.stack:
      if isinstance(layer, SlimmableLayer):
        x = layer(x, width=width)
      else:
        x = layer(x, training=training)
    return x


def slimmable_layers(model: tf.Module) -> list[SlimmableLayer]:
  """The slimmable layers inside `model` (any depth)."""
  return [m for m in model.submodules if isinstance(m, SlimmableLayer)]


def variable_masks(model: tf.keras.Model, width: Width) -> list[tf.Tensor]:
  """0/1 float32 masks of the coordinates `width` uses.

  Aligned with `model.trainable_variables`; variables outside slimmable
  layers are all ones. Works with a graph width.
  """
  masks = {}
  for layer in slimmable_layers(model):
    for variable, mask in layer.variable_masks(width):
      masks[variable.ref()] = mask
  return [
      masks.get(v.ref(), tf.ones(v.shape, tf.float32))
      for v in model.trainable_variables
  ]


def active_parameter_count(model: tf.keras.Model, width: float) -> int:
  """Parameters (all weights) that a forward pass at `width` uses."""
  width = float(check_width(width).numpy())
  counted = set()
  total = 0
  for layer in slimmable_layers(model):
    total += layer.active_parameter_count(width)
    counted.update(v.ref() for v in layer.weights)
  total += sum(
      int(np.prod(v.shape)) for v in model.weights if v.ref() not in counted
  )
  return total


def multiply_accumulates(model: SlimmableModel, width: float) -> int:
  """Multiply-accumulates of one example at `width` (dense and conv layers).

  Runs one eager forward pass on a zero example and sums what the layers
  record (`layer.last_active['macs']`).
  """
  features = tf.zeros([1, *model.feature_spec.shape[1:]],
                      model.feature_spec.dtype)
  layers = slimmable_layers(model)
  for layer in layers:
    layer.last_active = None
  model(slimmable_inputs(features, tf.constant(width, tf.float32)))
  total = 0
  for layer in layers:
    if layer.last_active is None or layer.last_active['macs'] is None:
      raise ValueError(f'Layer {layer.name!r} did not record its size.')
    total += layer.last_active['macs']
  return total
