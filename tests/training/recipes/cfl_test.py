"""Clustered FL in the driver: a rotated group split off, exact resume."""

import json
import os

import numpy as np
import tensorflow as tf

from tests import tff_test_utils
from tests.training.recipes import recipe_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training.recipes import cfl

def _config(output_dir, **overrides):
  # Split whenever allowed after round 1: the norms of a round of digits
  # are far below the defaults (the criterion itself: clustering_test).
  return recipe_test_utils.digits_config(output_dir, **{
      'algorithm': 'cfl', 'num_clients': 8, 'clients_per_round': 8,
      'rounds': 3, 'attack': 'none', 'malicious_fraction': 0.0,
      'cfl_warmup_rounds': 1, 'cfl_eps1': 100.0, 'cfl_eps2': 0.0,
      'cfl_max_clusters': 2, 'eval_every': 1, **overrides})


def _texts(output_dir):
  """The recipe's files and metrics.csv without its timings."""
  return recipe_test_utils.run_texts(output_dir, cfl.Cfl.output_files)


class CflSettingsTest(tf.test.TestCase):

  def test_bad_settings_are_refused_naming_the_flags(self):
    out = self.create_tempdir().full_path
    for overrides, message in (
        (dict(cfl_eps1=0.0), '--cfl_eps1 must be a finite number > 0'),
        (dict(cfl_eps2=-1.0), '--cfl_eps2 must be a finite number >= 0'),
        (dict(cfl_warmup_rounds=-1), '--cfl_warmup_rounds must be an int'),
        (dict(cfl_max_clusters=0), '--cfl_max_clusters must be an int >= 1'),
        (dict(cfl_min_separation=2.0),
         r'--cfl_min_separation must be a number in \[-2, 2\)'),
        (dict(cfl_max_clusters=9),
         '--cfl_max_clusters=9 is more than --num_clients=8'),
        (dict(aggregator='robust'), '--aggregator=robust would be ignored'),
        (dict(server_optimizer='adam'),
         '--server_optimizer=adam would be ignored'),
    ):
      with self.subTest(overrides), self.assertRaisesRegex(
          config_lib.ConfigError, message):
        _config(out, **overrides)


class CflRunTest(tff_test_utils.TffTestCase):

  def _run(self, output_dir, kill_in_round=None):
    """A run where half the clients see their digits upside down; the
    state its final evaluations saw."""
    return recipe_test_utils.run_keeping_state(
        cfl.Cfl, _config(output_dir, rotated_client_fraction=0.5),
        kill_in_round)

  def test_a_federation_without_groups_does_not_split(self):
    # The same norms criterion (always met after round 1), no rotated
    # clients: every bi-partition's separation gap is <= 0.
    output_dir = self.create_tempdir().full_path
    result = driver.run(_config(output_dir, rounds=4))
    self.assertEqual([h['clusters'] for h in result.history], [1] * 4)
    rows = recipe_test_utils.read_round_log(output_dir, cfl.CLUSTER_LOG)
    gaps = [float(r['separation']) for r in rows if int(r['round']) > 1]
    self.assertLen(gaps, 3)
    self.assertTrue(all(g <= 0 for g in gaps), gaps)
    # With the check off, the same run splits in round 2.
    unchecked = driver.run(_config(self.create_tempdir().full_path, rounds=2,
                                   cfl_min_separation=-2.0))
    self.assertEqual(unchecked.history[-1]['cluster_splits'], 1)

  def test_rotated_group_splits_off_and_a_killed_run_resumes_exactly(self):
    straight_dir = self.create_tempdir().full_path
    straight, state = self._run(straight_dir)
    # The run names its rotated clients (a seeded half) per client.
    rows = recipe_test_utils.read_round_log(straight_dir, 'clients_final.csv')
    rotated = {r['client'] for r in rows if r['rotated'] == '1'}
    self.assertLen(rotated, 4)
    history = straight.history
    self.assertEqual([h['clusters'] for h in history], [1, 2, 2])
    self.assertEqual([h['cluster_splits'] for h in history], [0, 1, 0])
    self.assertEqual(history[-1]['cluster_size_min'], 4)
    self.assertEqual(history[-1]['clients_unplaced'], 0)
    with open(os.path.join(straight_dir, cfl.TREE_FILE)) as f:
      tree = json.load(f)
    clusters = [set(node['clients']) for node in tree if node['cluster']]
    # Purity 1.0: each cluster is all rotated or all upright.
    self.assertCountEqual(
        clusters, [rotated, {f'client_{i:04d}' for i in range(8)} - rotated])
    self.assertEqual([node['split_round'] for node in tree], [0, 2, 2])
    # Each cluster's model is its own, and better on its clients than the
    # root model (kept as it was at the split) is.
    self.assertNotAllClose(state['slots']['trainable'][0][1],
                           state['slots']['trainable'][0][2])
    self.assertCountEqual(straight.evaluations, ['global', 'personalized'])
    mean = lambda kind: np.mean(
        [m.accuracy for m in straight.evaluations[kind].values()])
    self.assertGreater(mean('personalized'), mean('global'))
    texts = _texts(straight_dir)

    # Killed in round 3 after its logs were written, before its checkpoint:
    # the resumed run restores round 2's clusters and ends as the straight
    # one did, byte for byte.
    split_dir = self.create_tempdir().full_path
    with self.assertRaises(recipe_test_utils.Killed):
      self._run(split_dir, kill_in_round=3)
    resumed, resumed_state = self._run(split_dir)
    self.assertEqual(resumed.resumed_from_round, 2)
    self.assertEqual(resumed.history[0]['clusters'], 2)
    self.assertEqual(_texts(split_dir), texts)
    self.assertEqual(resumed.evaluations, straight.evaluations)
    recipe_test_utils.assert_same_state(self, state, resumed_state)


if __name__ == '__main__':
  tf.test.main()
