"""Clustered FL's server decisions (numpy): linkage, criterion, placement."""

import dataclasses

from absl.testing import absltest
import numpy as np

from tff_fair.algorithms import clustering


def _tree(slots):
  """(parent, split_round) of a fresh tree of `slots` slots: the root only."""
  parent = np.full([slots], clustering.NO_PARENT)
  split_round = np.full([slots], clustering.UNUSED)
  split_round[0] = 0
  return parent, split_round


class CompleteLinkageTest(absltest.TestCase):

  def test_known_matrix(self):
    # Similarities of 5 points, distances their negatives. Merges: {0, 2}
    # (0.9), {3, 4} (0.8), then 1 joins {3, 4}: its complete-linkage
    # similarity to it is min(0.4, 0.7) = 0.4, to {0, 2} min(-0.5, -0.7);
    # 4's 0.6 with 0 does not pull it to {0, 2} (its -0.9 with 2 does not).
    s = np.array([
        [1.0, -0.5, 0.9, -0.6, 0.6],
        [-0.5, 1.0, -0.7, 0.4, 0.7],
        [0.9, -0.7, 1.0, -0.8, -0.9],
        [-0.6, 0.4, -0.8, 1.0, 0.8],
        [0.6, 0.7, -0.9, 0.8, 1.0],
    ])
    self.assertEqual(clustering.complete_linkage_bipartition(-s),
                     ([0, 2], [1, 3, 4]))

  def test_merge_order_by_largest_distance(self):
    # Points on a line at 0, 1, 2.1, 10: complete linkage merges {0, 1},
    # then {0, 1, 2.1} (its largest distance 2.1 < 7.9), leaving 10.
    x = np.array([0.0, 1.0, 2.1, 10.0])
    self.assertEqual(
        clustering.complete_linkage_bipartition(np.abs(x[:, None] - x)),
        ([0, 1, 2], [3]))

  def test_two_points_and_bad_input(self):
    self.assertEqual(
        clustering.complete_linkage_bipartition(np.zeros([2, 2])),
        ([0], [1]))
    for bad in (np.zeros([1, 1]), np.zeros([2, 3]),
                np.array([[0.0, 1.0], [2.0, 0.0]]),
                np.array([[0.0, np.nan], [np.nan, 0.0]])):
      with self.assertRaises(ValueError):
        clustering.complete_linkage_bipartition(bad)

  def test_separation_gap(self):
    s = np.array([
        [1.0, 0.9, -0.2, -0.3],
        [0.9, 1.0, 0.1, -0.4],
        [-0.2, 0.1, 1.0, 0.5],
        [-0.3, -0.4, 0.5, 1.0],
    ])
    # Least within: 0.5 ({2, 3}); most across: 0.1 (1 with 2).
    self.assertAlmostEqual(
        clustering.separation_gap(s, ([0, 1], [2, 3])), 0.4)
    # A half of one counts 1 within; {1, 2, 3}'s least: -0.4 (1 with 3);
    # most across: 0.9 (0 with 1).
    self.assertAlmostEqual(
        clustering.separation_gap(s, ([0], [1, 2, 3])), -0.4 - 0.9)

  def test_cosine_similarities(self):
    s = clustering.cosine_similarities(
        np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0], [0.0, 0.0]]))
    np.testing.assert_allclose(s[0], [1.0, 1.0, 0.0, 0.0])
    self.assertEqual(s[3, 3], 0.0)  # A zero update is like nothing.


def _update(index, slot, direction, scale=1.0, weight=1.0):
  return clustering.ClientUpdate(index, slot,
                                 scale * np.asarray(direction, np.float64),
                                 weight)


class DecideTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.rule = clustering.SplitRule(eps1=0.5, eps2=1.0, warmup_rounds=2)

  def test_split_criterion(self):
    splits = self.rule.splits
    self.assertTrue(splits(0.4, 1.1, 3, round_num=3))
    self.assertFalse(splits(0.4, 1.1, 3, round_num=2))  # Warm-up.
    self.assertFalse(splits(0.5, 1.1, 3, round_num=3))  # Mean not small.
    self.assertFalse(splits(0.4, 1.0, 3, round_num=3))  # No large update.
    self.assertFalse(splits(0.4, 1.1, 2, round_num=3))  # Two clients.
    for bad in (dict(eps1=0.0), dict(eps1=float('inf')), dict(eps2=-1.0),
                dict(warmup_rounds=-1), dict(warmup_rounds=1.5),
                dict(min_separation=2.0), dict(min_separation=-2.5),
                dict(min_separation=float('nan'))):
      with self.subTest(bad), self.assertRaises(ValueError):
        clustering.SplitRule(**bad)

  def test_split_maps_positions_back_to_client_indices(self):
    # Cluster 2 (a sub-cluster of the root) holds clients 3, 7, 8, 11: a
    # non-contiguous set whose positions 0..3 are not their indices.
    # Clients 3 and 11 pull one way, 7 and 8 the other; mean update 0.
    parent, split_round = _tree(7)
    parent[[1, 2]] = 0
    split_round[[1, 2]] = 1
    directions = np.zeros([7, 2])
    updates = [_update(3, 2, [1.0, 0.1], 2.0), _update(7, 2, [-1.0, 0.0], 2),
               _update(8, 2, [-1.0, -0.1], 2.0), _update(11, 2, [1.0, 0.0], 2),
               _update(0, 1, [1.0, 0.0], 0.1)]  # Cluster 1: one client.
    decisions = clustering.decide(parent, split_round, directions, updates,
                                  round_num=5, rule=self.rule)
    (split,) = decisions.splits
    self.assertEqual(split.cluster, 2)
    self.assertEqual(split.children, (3, 4))
    # By client index, not position ((0, 3), (1, 2)).
    self.assertEqual(split.groups, ((3, 11), (7, 8)))
    self.assertEqual(split.sampled, 4)
    self.assertAlmostEqual(split.max_norm, 2.0 * np.hypot(1.0, 0.1))
    np.testing.assert_allclose(decisions.directions[3], [2.0, 0.1])
    np.testing.assert_allclose(decisions.directions[4], [-2.0, -0.1])
    # Cluster 1 had one sampled member: it does not split.
    self.assertEqual([c.cluster for c in decisions.clusters], [1, 2])

    membership = np.array([1, 1, 1, 2, 1, 1, 1, 2, 2, 1, 2, 2, 1])
    membership, parent, split_round = clustering.apply(
        membership, parent, split_round, decisions, round_num=5)
    np.testing.assert_array_equal(
        membership, [1, 1, 1, 3, 1, 1, 1, 4, 4, 1, 2, 3, 1])  # 10: unplaced.
    np.testing.assert_array_equal(parent, [-1, 0, 0, 2, 2, -1, -1])
    np.testing.assert_array_equal(split_round, [0, 1, 1, 5, 5, -1, -1])
    self.assertEqual(clustering.leaves(parent, split_round), [1, 3, 4])

    # Client 10, not sampled at the split, is placed by its next update:
    # near the direction of sub-cluster 4 (7 and 8).
    later = clustering.decide(parent, split_round,
                              np.array([[0, 0], [0, 0], [0, 0], [2.0, 0.1],
                                        [-2.0, -0.1], [0, 0], [0, 0]]),
                              [_update(10, 2, [-0.5, 0.3])], 6, self.rule)
    self.assertEqual(later.placed, {10: 4})
    self.assertEqual(later.clusters, ())  # Nobody trained at a leaf.

  def test_no_split_without_free_slots_or_in_warmup(self):
    updates = [_update(i, 0, [(-1.0) ** i, 0.0], 2.0) for i in range(4)]
    for slots, round_num in ((1, 5), (7, 2)):
      parent, split_round = _tree(slots)
      decisions = clustering.decide(parent, split_round,
                                    np.zeros([slots, 2]), updates, round_num,
                                    self.rule)
      (root,) = decisions.clusters
      self.assertEqual((root.children, root.sampled), ((), 4))
      self.assertEqual(root.mean_norm, 0.0)

  def test_updates_without_groups_do_not_split(self):
    # Twelve clients whose updates scatter around one direction: the norms
    # call for a split (a rule whose norm criterion always holds), but no
    # bi-partition of them is separated.
    rng = np.random.default_rng(0)
    updates = [_update(i, 0, rng.normal(size=20) + 0.2, 1.0)
               for i in range(12)]
    rule = clustering.SplitRule(eps1=100.0, eps2=0.0, warmup_rounds=0)
    for checked, splits in ((rule, False),
                            (dataclasses.replace(rule, min_separation=-2.0),
                             True)):
      parent, split_round = _tree(3)
      decisions = clustering.decide(parent, split_round, np.zeros([3, 20]),
                                    updates, 5, checked)
      (root,) = decisions.clusters
      self.assertLess(root.separation, 0)
      self.assertEqual(bool(root.children), splits)
    # Two groups pointing apart split, with a positive gap.
    grouped = [_update(i, 0, rng.normal(size=20) * 0.1
                       + (5.0 if i < 6 else -5.0) * np.eye(20)[0], 0.2)
               for i in range(12)]
    (root,) = clustering.decide(parent, split_round, np.zeros([3, 20]),
                                grouped, 5, rule).clusters
    self.assertGreater(root.separation, 0)
    self.assertEqual(root.groups, (tuple(range(6)), tuple(range(6, 12))))

  def test_non_finite_updates_are_not_counted(self):
    parent, split_round = _tree(3)
    # Three sampled, but one with weight 0: two members, no split.
    updates = [_update(0, 0, [1.0, 0.0], 2.0), _update(1, 0, [-1.0, 0.0], 2),
               _update(2, 0, [np.nan, 0.0], weight=0.0)]
    decisions = clustering.decide(parent, split_round, np.zeros([3, 2]),
                                  updates, 5, self.rule)
    self.assertEqual(decisions.clusters[0].sampled, 2)
    self.assertEqual(decisions.splits, ())

  def test_num_slots(self):
    self.assertEqual(clustering.num_slots(1), 1)
    self.assertEqual(clustering.num_slots(4), 7)
    with self.assertRaises(ValueError):
      clustering.num_slots(0)


if __name__ == '__main__':
  absltest.main()
