"""A client's part of a model, kept apart and joined back (FedRep's heads)."""

import numpy as np
import tensorflow as tf

from tff_fair.models import model_fns
from tff_fair.models import parts
from tff_fair.training import client_models


def _spec():
  return model_fns.build_model_spec(
      'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
      num_classes=10)


class ModelPartTest(tf.test.TestCase):

  def test_head_is_the_output_layer_and_joins_any_body(self):
    spec = _spec()
    own, other = spec.initial_weights(0), spec.initial_weights(1)
    head = parts.head(spec.head_variables)
    part = head.extract(own)
    self.assertLen(part.trainable, 2)
    self.assertEqual(part.trainable[0].shape, (84, 10))  # The logits' kernel.
    self.assertEmpty(part.non_trainable)
    whole = head.compose(other, part)
    # The other model's body, this model's head.
    for got, want in zip(whole.trainable, [*other.trainable[:-2],
                                           *own.trainable[-2:]]):
      np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        whole.trainable[0], other.trainable[0])
    # The whole part is the model itself.
    self.assertIs(parts.WHOLE.extract(own), own)
    self.assertIs(parts.WHOLE.compose(other, own), own)

  def test_a_head_needs_a_body(self):
    with self.assertRaisesRegex(ValueError, 'needs a body'):
      parts.head(10).extract(_spec().initial_weights(0))
    with self.assertRaisesRegex(ValueError, '>= 1'):
      parts.head(0)

  def test_the_disk_store_keeps_heads_and_evaluates_whole_models(self):
    spec = _spec()
    global_weights, own = spec.initial_weights(0), spec.initial_weights(1)
    root = self.create_tempdir().full_path
    store = client_models.ClientModelStore(root, global_weights,
                                           parts.head(2))
    store.open(0)
    store.write('a', parts.head(2).extract(own), round_num=1)
    store.commit(1)
    reopened = client_models.ClientModelStore(root, global_weights,
                                              parts.head(2))
    reopened.open(1)
    self.assertLen(reopened.weights('a').trainable, 2)
    whole = reopened.lookup(global_weights)('a')
    np.testing.assert_array_equal(whole.trainable[-1], own.trainable[-1])
    np.testing.assert_array_equal(whole.trainable[0],
                                  global_weights.trainable[0])
    # A client without an entry uses the global model.
    self.assertIs(reopened.lookup(global_weights)('b'), global_weights)


if __name__ == '__main__':
  tf.test.main()
