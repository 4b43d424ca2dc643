"""FedRep in the driver: heads kept with the checkpoints, exact resume."""

import os

import tensorflow as tf

from tests import tff_test_utils
from tests.training.recipes import recipe_test_utils
from tff_fair.models import model_fns
from tff_fair.models import parts
from tff_fair.training import client_models
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training.recipes import fedrep


def _config(output_dir, **overrides):
  return recipe_test_utils.digits_config(
      output_dir, **{'algorithm': 'fedrep', **overrides})


def _rows(output_dir):
  return recipe_test_utils.read_round_log(output_dir, fedrep.ROUND_LOG)


def _metrics(output_dir):
  """metrics.csv without its timings."""
  return recipe_test_utils.run_texts(output_dir)['metrics.csv']


# The digits' default architecture.
_SPEC = model_fns.build_model_spec(
    'lenet', x_shape=(8, 8, 1), x_dtype=tf.float32, y_shape=(),
    num_classes=10)


def _heads(config):
  """Client id -> its head's arrays, as the run's store holds them."""
  store = client_models.ClientModelStore(
      os.path.join(config.output_dir, fedrep.HEADS_DIR),
      _SPEC.initial_weights(config.seed), parts.head(_SPEC.head_variables))
  store.open(config.rounds)
  return {cid: store.weights(cid).trainable
          for cid in store.trained_client_ids()}


class FedRepTest(tff_test_utils.TffTestCase):

  def test_bad_settings_are_refused(self):
    out = self.create_tempdir().full_path
    with self.assertRaisesRegex(config_lib.ConfigError,
                                'personal_epochs must be >= 1'):
      _config(out, personal_epochs=0)
    # A personal rate of 0 is the client rate, recorded as such.
    self.assertEqual(_config(out).settings.personal_learning_rate, 0.1)

  def test_heads_stay_per_client_and_a_stopped_run_resumes_exactly(self):
    straight_config = _config(self.create_tempdir().full_path, eval_every=1)
    straight = driver.run(straight_config)
    rows = _rows(straight_config.output_dir)
    self.assertLen(rows, 3 * 4)
    heads = _heads(straight_config)
    self.assertLen(heads, 4)
    # Only the body travels: 4 bytes per body parameter.
    body = _SPEC.initial_weights(0).trainable[:-_SPEC.head_variables]
    body_bytes = 4 * sum(w.size for w in body)
    self.assertEqual({int(row['bytes_sent']) for row in rows}, {body_bytes})
    metrics = _metrics(straight_config.output_dir)
    self.assertEqual({float(m['client_work_bytes_sent']) for m in metrics},
                     {4 * body_bytes})
    # Every client's head is its own.
    ids = sorted(heads)
    for a in ids:
      for b in ids[ids.index(a) + 1:]:
        self.assertNotAllClose(heads[a][0], heads[b][0])
    # Only the personalized models are reported: the global one's head is
    # the initial one.
    self.assertCountEqual(straight.evaluations, ['personalized'])
    self.assertIn('test_accuracy_mean', metrics[-1])
    self.assertNotIn('global_test_accuracy_mean', metrics[-1])

    # Stopped after round 2 (its checkpoint and heads saved), resumed.
    split_config = _config(self.create_tempdir().full_path, eval_every=1)
    driver.run(_config(split_config.output_dir, eval_every=1, rounds=2))
    resumed = driver.run(split_config)
    self.assertEqual(resumed.resumed_from_round, 2)
    self.assertEqual(_rows(split_config.output_dir), rows)
    self.assertEqual(_metrics(split_config.output_dir), metrics)
    resumed_heads = _heads(split_config)
    self.assertEqual(sorted(resumed_heads), ids)
    for cid in ids:
      for a, b in zip(resumed_heads[cid], heads[cid]):
        self.assertEqual(a.tobytes(), b.tobytes())
    self.assertEqual(resumed.evaluations, straight.evaluations)


if __name__ == '__main__':
  tf.test.main()
