"""Our processes embedded in TFF's own drivers, as a TFF user would run them.

A user has a Keras model and a `tff.simulation.datasets.ClientData`; they
build a process and hand it to `tff.learning.programs.train_model`,
`tff.simulation.run_training_process` or a loop of their own, passing plain
client data sets to `next`. No `tff_fair` driver, no attack specs.
"""

import asyncio
import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import tff_test_utils
from tff_fair.algorithms import aequa
from tff_fair.algorithms import ditto
from tff_fair.algorithms import fed_avg
from tff_fair.data import program_data
from tff_fair.data.sources import digits
from tff_fair.models import model_fns
from tff_fair.runtime import local

_DIGITS = digits.load_digits()
_BATCH = 20


def _keras_model() -> tf.keras.Model:
  """The user's own model: a small dense network for 8x8 digits."""
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(8, 8, 1)),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(32, activation='relu'),
      tf.keras.layers.Dense(10),
  ])


_INPUT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, 8, 8, 1], tf.float32),
    y=tf.TensorSpec([None], tf.int32))


def _model_fn() -> tff.learning.models.VariableModel:
  return tff.learning.models.from_keras_model(
      _keras_model(), input_spec=_INPUT_SPEC,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def _sgd(lr):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


def _label_skewed_clients(num_clients=4, train=100, test=60):
  """Client k holds digits 2k and 2k + 1 only: (train, test) ClientData."""
  x, y = _DIGITS.x, _DIGITS.y
  splits = ({}, {})
  for k in range(num_clients):
    rows = np.flatnonzero((y == 2 * k) | (y == 2 * k + 1))
    rows = np.random.default_rng(k).permutation(rows)[:train + test]
    for split, chosen in zip(splits, (rows[:train], rows[train:])):
      split[f'client_{k}'] = collections.OrderedDict(x=x[chosen],
                                                     y=y[chosen])
  return tuple(tff.simulation.datasets.TestClientData(s) for s in splits)


def _batched(client_data, client_ids):
  return [client_data.create_tf_dataset_for_client(c).batch(_BATCH)
          for c in client_ids]


def _accuracy(weights, client_data, client_id) -> float:
  model = _keras_model()
  weights.assign_weights_to(model)
  examples = next(iter(
      client_data.create_tf_dataset_for_client(client_id).batch(10_000)))
  predicted = np.argmax(model(examples['x']).numpy(), axis=-1)
  return float(np.mean(predicted == examples['y'].numpy()))


def _plain_client_type(process):
  return process.next.type_signature.parameter[1]


class DerivedSeedTest(tf.test.TestCase):

  def test_seed_follows_weights_and_first_batch(self):
    def data(offset):
      return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          x=np.arange(offset, offset + 6, dtype=np.float32),
          y=np.arange(6, dtype=np.int32))).batch(3)

    weights = [tf.ones([2, 2]), tf.zeros([3])]
    moved = [tf.ones([2, 2]), tf.constant([0.0, 0.0, 1e-6])]
    seed = fed_avg.derived_seed(weights, data(0)).numpy()
    self.assertEqual(seed.dtype, np.int32)
    self.assertEqual(seed.shape, (2,))
    self.assertAllEqual(seed, fed_avg.derived_seed(weights, data(0)))
    self.assertNotAllEqual(seed, fed_avg.derived_seed(moved, data(0)))
    self.assertNotAllEqual(seed, fed_avg.derived_seed(weights, data(1)))
    # Only the first batch is read.
    self.assertAllEqual(
        seed, fed_avg.derived_seed(weights, data(0).take(1)))
    empty = fed_avg.derived_seed(weights, data(0).take(0)).numpy()
    self.assertEqual(empty.shape, (2,))


class EmbeddingTest(tff_test_utils.TffTestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.train, cls.test = _label_skewed_clients()

  def test_fed_avg_in_tff_train_model(self):
    process = fed_avg.build_fed_avg(_model_fn, _sgd(0.1))
    theirs = tff.learning.algorithms.build_weighted_fed_avg(
        _model_fn, client_optimizer_fn=_sgd(0.1))
    # TFF's client input and placements (the state's content differs: TFF's
    # client work keeps the client optimizer's hyperparameters).
    self.assertEqual(_plain_client_type(process), _plain_client_type(theirs))
    self.assertEqual(process.next.type_signature.result.state.placement,
                     tff.SERVER)
    self.assertEqual(process.next.type_signature.result.metrics.placement,
                     tff.SERVER)

    data_source = program_data.DatasetDataSource(
        _batched(self.train, self.train.client_ids))
    state_manager = tff.program.FileProgramStateManager(
        self.create_tempdir().full_path)
    model_output = tff.program.MemoryReleaseManager()
    metrics_output = tff.program.MemoryReleaseManager()
    context = tff.program.NativeFederatedContext(
        local.create_async_context(self.worker))
    with tff.framework.get_context_stack().install(context):
      asyncio.run(tff.learning.programs.train_model(
          train_process=process,
          train_data_source=data_source,
          train_per_round_clients=3,
          train_total_rounds=3,
          program_state_manager=state_manager,
          model_output_manager=model_output,
          train_metrics_manager=metrics_output,
          evaluation_manager=None,
          evaluation_periodicity=1))

    metrics = metrics_output.values()
    self.assertEqual(sorted(metrics), [1, 2, 3])
    # train_model releases client_work/train as model_metrics.
    train = [metrics[r]['model_metrics'] for r in (1, 2, 3)]
    self.assertEqual([t['num_examples'] for t in train], [300] * 3)
    self.assertLess(train[-1]['loss'], train[0]['loss'])
    self.assertEqual(list(model_output.values()),
                     ['training_checkpoint_round_3'])
    self.assertEqual(asyncio.run(state_manager.get_versions()),
                     [0, 1, 2, 3])

  def test_ditto_in_tff_simulation_and_a_user_loop(self):
    process = ditto.build_ditto(_model_fn, _sgd(0.1))
    self.assertEqual(
        _plain_client_type(process),
        tff.FederatedType(tff.SequenceType(tff.types.tensorflow_to_type(
            _INPUT_SPEC)), tff.CLIENTS))
    client_ids = self.train.client_ids

    # The global model alone, in TFF's simulation loop.
    state = tff.simulation.run_training_process(
        process, lambda round_num: _batched(self.train, client_ids[:3]),
        total_rounds=1)

    # A user's loop with personal models kept in memory: every client
    # joins every round.
    personal = ditto.PersonalModels(process, lam=0.1)
    for _ in range(3):
      state, metrics = personal.round(
          state, client_ids, _batched(self.train, client_ids))
    self.assertEqual(metrics['client_work']['train']['num_examples'], 400)
    self.assertLen(personal, 4)
    global_weights = process.get_model_weights(state)
    global_accuracy = [_accuracy(global_weights, self.test, c)
                       for c in client_ids]
    personal_accuracy = [_accuracy(personal[c], self.test, c)
                         for c in client_ids]
    # Two classes per client: its personal model knows them, the global
    # model has to tell eight apart.
    self.assertGreater(np.mean(personal_accuracy),
                       np.mean(global_accuracy) + 0.1,
                       (personal_accuracy, global_accuracy))
    self.assertGreater(min(personal_accuracy), 0.8, personal_accuracy)
    self.assertGreaterEqual(
        sum(p > g for p, g in zip(personal_accuracy, global_accuracy)), 3)
    # A client never personalized gets the global model.
    self.assertNotIn('client_9', personal)
    self.assertAllClose(personal.get('client_9', state).trainable,
                        global_weights.trainable)

  def test_aequa_in_tff_simulation_reproduces_without_client_seeds(self):
    spec = model_fns.build_model_spec(
        'slimmable_lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
        num_classes=10)
    process = aequa.build_aequa(spec.model_fn, _sgd(0.1), p_min=0.25,
                                widths_per_step=2)
    # Plain batches; the width is added inside.
    self.assertEqual(
        _plain_client_type(process),
        tff.FederatedType(tff.SequenceType(tff.types.tensorflow_to_type(
            _INPUT_SPEC)), tff.CLIENTS))
    client_ids = self.train.client_ids
    select = lambda round_num: _batched(self.train, client_ids[:2])

    # TFF's simulation loop (it starts from `initialize()`).
    state = tff.simulation.run_training_process(process, select,
                                                total_rounds=1)
    self.assertTrue(all(np.isfinite(w).all() for w in
                        process.get_model_weights(state).trainable))

    # Without client seeds, the widths follow the state and the data:
    # the same start and data give the same run.
    start = spec.initial_weights(seed=0)

    def run(built):
      state = built.set_model_weights(built.initialize(), start)
      for round_num in range(2):
        state = built.next(state, select(round_num)).state
      return built.get_model_weights(state).trainable

    first, second = run(process), run(process)
    self.assertAllClose(first, second)
    self.assertNotAllClose(first, start.trainable)


if __name__ == '__main__':
  tf.test.main()
