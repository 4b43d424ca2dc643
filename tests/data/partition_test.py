"""Tests for tff_fair.data.partition (pure numpy, synthetic labels)."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from tff_fair.data import partition as p

_NUM_CLASSES = 10


def _labels(n=5000, seed=0, num_classes=_NUM_CLASSES):
  """Unbalanced synthetic labels: class c has weight c + 1."""
  rng = np.random.default_rng(seed)
  weights = np.arange(1, num_classes + 1, dtype=float)
  return rng.choice(num_classes, size=n, p=weights / weights.sum())


# (kind, params) covering every scheme through the dispatcher.
_SCHEMES = (
    ('homogeneous', {}),
    ('dirichlet', {'alpha': 0.5}),
    ('quantity_skew', {'kappa': 0.6, 'm': 3}),
    ('label_skew', {'classes_per_client': 2}),
)


def _class_counts(labels, clients):
  return np.stack(
      [np.bincount(labels[c], minlength=_NUM_CLASSES) for c in clients]
  )


def _mean_max_share(labels, clients):
  counts = _class_counts(labels, clients)
  return float(np.mean(counts.max(axis=1) / counts.sum(axis=1)))


class CommonPropertiesTest(parameterized.TestCase):

  @parameterized.parameters(*_SCHEMES)
  def test_disjoint_nonempty_sorted(self, kind, params):
    labels = _labels()
    clients = p.partition(kind, labels, 20, seed=1, **params)
    self.assertLen(clients, 20)
    joined = np.concatenate(clients)
    self.assertLen(np.unique(joined), len(joined))  # Each example once.
    self.assertTrue(((joined >= 0) & (joined < len(labels))).all())
    for c in clients:
      self.assertNotEmpty(c)
      self.assertEqual(c.dtype, np.int64)
      np.testing.assert_array_equal(c, np.sort(c))

  @parameterized.parameters(*_SCHEMES[:3])
  def test_every_example_used(self, kind, params):
    labels = _labels()
    clients = p.partition(kind, labels, 20, seed=1, **params)
    self.assertEqual(sum(len(c) for c in clients), len(labels))

  @parameterized.parameters(*_SCHEMES)
  def test_deterministic_by_seed(self, kind, params):
    labels = _labels()
    first = p.partition(kind, labels, 20, seed=7, **params)
    again = p.partition(kind, labels, 20, seed=7, **params)
    other = p.partition(kind, labels, 20, seed=8, **params)
    for a, b in zip(first, again):
      np.testing.assert_array_equal(a, b)
    self.assertFalse(all(np.array_equal(a, b) for a, b in zip(first, other)))

  @parameterized.parameters(*_SCHEMES)
  def test_more_clients_than_examples(self, kind, params):
    with self.assertRaisesRegex(
        p.PartitionError, 'Cannot give 30 clients at least one example'
    ):
      p.partition(kind, _labels(n=20), 30, seed=0, **params)

  @parameterized.parameters(0, -1, 2.5, True)
  def test_bad_num_clients(self, num_clients):
    with self.assertRaisesRegex(p.PartitionError, 'num_clients must be'):
      p.homogeneous(_labels(), num_clients, seed=0)

  def test_rejects_sequence_labels(self):
    with self.assertRaisesRegex(p.PartitionError, '1-D integer array'):
      p.dirichlet(np.zeros((10, 3), np.int32), 2, 0.5, seed=0)


class HomogeneousTest(absltest.TestCase):

  def test_per_class_and_total_counts_within_one(self):
    labels = _labels(n=4999)
    clients = p.homogeneous(labels, 7, seed=0)
    counts = _class_counts(labels, clients)
    spread = counts.max(axis=0) - counts.min(axis=0)
    self.assertLessEqual(int(spread.max()), 1)
    sizes = counts.sum(axis=1)
    self.assertLessEqual(int(sizes.max() - sizes.min()), 1)

  def test_one_example_per_client(self):
    clients = p.homogeneous(np.array([0, 1, 1]), 3, seed=0)
    self.assertEqual(sorted(len(c) for c in clients), [1, 1, 1])


class DirichletTest(parameterized.TestCase):

  def test_smaller_alpha_more_skew(self):
    labels = _labels(n=20000)
    shares = {
        alpha: np.mean([
            _mean_max_share(labels, p.dirichlet(labels, 20, alpha, seed=s))
            for s in range(3)
        ])
        for alpha in (0.1, 0.5, 1.0, 100.0)
    }
    self.assertGreater(shares[0.1], shares[0.5])
    self.assertGreater(shares[0.5], shares[1.0])
    self.assertGreater(shares[1.0], shares[100.0])
    self.assertGreater(shares[0.1], 0.5)  # Strongly skewed.
    self.assertLess(shares[100.0], 0.25)  # Near the global max share 0.18.

  def test_min_size_respected(self):
    labels = _labels(n=20000)
    clients = p.dirichlet(labels, 50, 0.1, seed=3)
    self.assertGreaterEqual(min(len(c) for c in clients), 10)

  def test_default_min_size_lowered_for_small_data(self):
    labels = _labels(n=100)
    clients = p.dirichlet(labels, 10, 0.5, seed=0)  # min_size = 5 here.
    self.assertGreaterEqual(min(len(c) for c in clients), 5)

  @parameterized.parameters(0.0, -1.0, float('nan'), float('inf'), 'x')
  def test_bad_alpha(self, alpha):
    with self.assertRaisesRegex(p.PartitionError, 'alpha'):
      p.dirichlet(_labels(), 5, alpha, seed=0)

  def test_top_up_serves_more_clients_than_redraws_can(self):
    labels = _labels(n=7000)
    with self.assertRaisesRegex(p.PartitionError, 'top_up'):
      p.dirichlet(labels, 1000, 0.5, seed=1, max_attempts=5)
    clients = p.dirichlet(labels, 1000, 0.5, seed=1, top_up=True)
    self.assertGreaterEqual(min(len(c) for c in clients), 3)  # 7000 // 2000.
    everything = np.concatenate(clients)
    np.testing.assert_array_equal(np.sort(everything), np.arange(7000))
    again = p.dirichlet(labels, 1000, 0.5, seed=1, top_up=True)
    for a, b in zip(clients, again):
      np.testing.assert_array_equal(a, b)
    # Still label-skewed, unlike an IID split of the same sizes.
    self.assertGreater(_mean_max_share(labels, clients),
                       _mean_max_share(labels, p.homogeneous(labels, 1000,
                                                             seed=1)))

  def test_gives_up_after_max_attempts(self):
    labels = _labels(n=1000)
    with self.assertRaisesRegex(
        p.PartitionError, r'No Dirichlet\(alpha=0.05\) draw in 3 attempts'
    ):
      # Every client needing exactly N / K examples is practically impossible.
      p.dirichlet(labels, 10, 0.05, seed=0, min_size=100, max_attempts=3)

  def test_impossible_min_size(self):
    with self.assertRaisesRegex(p.PartitionError, 'min_size=101 is impossible'):
      p.dirichlet(_labels(n=1000), 10, 0.5, seed=0, min_size=101)


class QuantitySkewTest(parameterized.TestCase):

  def test_large_clients_hold_kappa_together(self):
    labels = _labels(n=10000)
    clients = p.quantity_skew(labels, 10, kappa=0.75, m=2, seed=0)
    sizes = np.array([len(c) for c in clients])
    large = sizes > 1000
    self.assertEqual(int(large.sum()), 2)
    self.assertEqual(int(sizes[large].sum()), 7500)
    self.assertLessEqual(int(sizes[large].max() - sizes[large].min()), 1)
    self.assertLessEqual(int(sizes[~large].max() - sizes[~large].min()), 1)
    self.assertEqual(int(sizes[~large].sum()), 2500)

  def test_kappa_for_each_large_client(self):
    labels = _labels(n=10000)
    clients = p.quantity_skew(labels, 10, kappa=0.3, m=2, seed=0,
                              kappa_scope='each')
    sizes = np.array([len(c) for c in clients])
    self.assertEqual(sorted(sizes[sizes > 1000].tolist()), [3000, 3000])
    self.assertEqual(sorted(set(sizes[sizes <= 1000].tolist())), [500])
    self.assertEqual(int(sizes.sum()), 10000)

  def test_kappa_for_each_needs_room(self):
    with self.assertRaisesRegex(
        p.PartitionError, r"m \* kappa = 1.2 must be below 1.*'shared'"):
      p.quantity_skew(_labels(), 10, kappa=0.4, m=3, seed=0,
                      kappa_scope='each')

  def test_large_clients_are_drawn_at_random(self):
    labels = _labels(n=10000)
    large_sets = set()
    for seed in range(8):
      clients = p.quantity_skew(labels, 10, kappa=0.5, m=3, seed=seed)
      sizes = np.array([len(c) for c in clients])
      large = tuple(np.flatnonzero(sizes > 1000).tolist())
      self.assertLen(large, 3)
      large_sets.add(large)
      again = p.quantity_skew(labels, 10, kappa=0.5, m=3, seed=seed)
      for a, b in zip(clients, again):
        np.testing.assert_array_equal(a, b)
    # Not always the first m: 8 seeds give several different sets.
    self.assertGreater(len(large_sets), 4)

  def test_first_rule_keeps_the_earlier_partition(self):
    labels = _labels(n=1000)
    first = p.quantity_skew(labels, 5, kappa=0.6, m=2, seed=3,
                            large_clients='first')
    self.assertEqual([len(c) for c in first], [300, 300, 134, 133, 133])
    # The same split of the data as the random rule, in another order.
    random = p.quantity_skew(labels, 5, kappa=0.6, m=2, seed=3)
    self.assertCountEqual([tuple(c) for c in first],
                          [tuple(c) for c in random])
    # And what tff_fair gave before the rule existed (first m large).
    order = np.random.default_rng(3).permutation(1000)
    np.testing.assert_array_equal(first[0], np.sort(order[:300]))
    np.testing.assert_array_equal(first[4], np.sort(order[867:]))

  def test_labels_stay_iid(self):
    labels = _labels(n=20000)
    clients = p.quantity_skew(labels, 5, kappa=0.5, m=1, seed=0)
    global_share = np.bincount(labels) / len(labels)
    for c in clients:
      share = np.bincount(labels[c], minlength=_NUM_CLASSES) / len(c)
      np.testing.assert_allclose(share, global_share, atol=0.03)

  @parameterized.parameters(0.0, 1.0, 1.5, -0.2, float('nan'))
  def test_bad_kappa(self, kappa):
    with self.assertRaisesRegex(p.PartitionError, '0 < kappa < 1'):
      p.quantity_skew(_labels(), 10, kappa=kappa, m=2, seed=0)

  @parameterized.parameters(0, 10, 11, 1.5)
  def test_bad_m(self, m):
    with self.assertRaisesRegex(p.PartitionError, '1 <= m < num_clients=10'):
      p.quantity_skew(_labels(), 10, kappa=0.5, m=m, seed=0)

  @parameterized.parameters(dict(large_clients='last'),
                            dict(kappa_scope='all'))
  def test_bad_rules(self, **rule):
    with self.assertRaisesRegex(p.PartitionError, 'must be one of'):
      p.quantity_skew(_labels(), 10, kappa=0.5, m=2, seed=0, **rule)

  def test_too_little_data_for_small_clients(self):
    with self.assertRaisesRegex(p.PartitionError, 'some would be empty'):
      p.quantity_skew(_labels(n=20), 10, kappa=0.9, m=1, seed=0)


class LabelSkewTest(parameterized.TestCase):

  @parameterized.product(
      clients_and_m=[(10, 1), (10, 2), (7, 3), (20, 2), (4, 10), (3, 2)],
      rule=['niid_bench', 'cyclic'])
  def test_each_client_exactly_m_classes(self, clients_and_m, rule):
    num_clients, m = clients_and_m
    labels = _labels()
    clients = p.label_skew(labels, num_clients, m, seed=0, rule=rule)
    held = [set(np.unique(labels[c])) for c in clients]
    self.assertTrue(all(len(h) == m for h in held))
    union = set.union(*held)
    if num_clients >= _NUM_CLASSES or num_clients * m >= _NUM_CLASSES and (
        rule == 'cyclic'):
      self.assertEqual(union, set(range(_NUM_CLASSES)))
    if rule == 'niid_bench':  # Client i holds class i mod 10.
      self.assertTrue(all(i % _NUM_CLASSES in h for i, h in enumerate(held)))
    # Every example of a held class is used; the others are not.
    self.assertEqual(sum(len(c) for c in clients),
                     int(np.isin(labels, list(union)).sum()))

  def test_niid_bench_class_sets_overlap(self):
    # 10 classes, m = 2, 20 clients. The cyclic rule gives 5 disjoint pairs
    # (each held by 4 clients); NIID-Bench's draws give many overlapping
    # pairs.
    cyclic = [tuple(a) for a in p.label_skew_assignment(10, 20, 2, seed=0,
                                                        rule='cyclic')]
    self.assertLen(set(cyclic), 5)
    self.assertLen(set(np.concatenate(cyclic)), 10)  # Disjoint blocks.
    for seed in range(5):
      pairs = [tuple(a) for a in p.label_skew_assignment(10, 20, 2, seed)]
      self.assertGreater(len(set(pairs)), 10)
      overlapping = [(a, b) for a in set(pairs) for b in set(pairs)
                     if a < b and len(set(a) & set(b)) == 1]
      self.assertNotEmpty(overlapping)

  def test_niid_bench_draws_the_other_classes_uniformly(self):
    # Over many clients, each class other than i mod 10 is client i's
    # second class about equally often (1 / 9 each).
    assignment = p.label_skew_assignment(10, 9000, 2, seed=1)
    second = np.array([[c for c in a if c != i % 10][0]
                       for i, a in enumerate(assignment)])
    first = np.arange(9000) % 10
    offsets = (second - first) % 10
    counts = np.bincount(offsets, minlength=10)
    self.assertEqual(int(counts[0]), 0)
    np.testing.assert_allclose(counts[1:] / 9000, np.full(9, 1 / 9),
                               atol=0.02)
    again = p.label_skew_assignment(10, 9000, 2, seed=1)
    other = p.label_skew_assignment(10, 9000, 2, seed=2)
    self.assertTrue(all(np.array_equal(a, b)
                        for a, b in zip(assignment, again)))
    self.assertFalse(all(np.array_equal(a, b)
                         for a, b in zip(assignment, other)))

  @parameterized.parameters('niid_bench', 'cyclic')
  def test_class_split_equally_among_holders(self, rule):
    labels = _labels()
    clients = p.label_skew(labels, 20, 2, seed=0, rule=rule)
    counts = _class_counts(labels, clients)
    for c in range(_NUM_CLASSES):
      holders = counts[:, c][counts[:, c] > 0]
      self.assertLessEqual(int(holders.max() - holders.min()), 1)
    holder_counts = (counts > 0).sum(axis=0)
    self.assertEqual(int(holder_counts.sum()), 40)
    if rule == 'cyclic':  # Balanced: 20 * 2 / 10 = 4 per class.
      np.testing.assert_array_equal(holder_counts, [4] * 10)
    else:  # Two guaranteed holders (i mod 10), plus random ones.
      self.assertGreaterEqual(int(holder_counts.min()), 2)
      self.assertGreater(int(holder_counts.max() - holder_counts.min()), 0)

  @parameterized.parameters('niid_bench', 'cyclic')
  def test_unheld_classes_unused(self, rule):
    labels = _labels()
    clients = p.label_skew(labels, 3, 2, seed=0, rule=rule)  # <= 6 held.
    held = set.union(*[set(np.unique(labels[c])) for c in clients])
    self.assertBetween(len(held), 3, 6)
    if rule == 'niid_bench':
      self.assertContainsSubset({0, 1, 2}, held)
    self.assertEqual(
        sum(len(c) for c in clients), int(np.isin(labels, list(held)).sum())
    )

  def test_cyclic_rule_keeps_the_earlier_partition(self):
    # What tff_fair gave before NIID-Bench's rule became the default.
    assignment = p.label_skew_assignment(5, 4, 2, seed=0, rule='cyclic')
    order = np.random.default_rng(0).permutation(5)
    expected = [np.sort(order[(2 * i + np.arange(2)) % 5]) for i in range(4)]
    for a, b in zip(assignment, expected):
      np.testing.assert_array_equal(a, b)

  def test_m_larger_than_classes(self):
    with self.assertRaisesRegex(
        p.PartitionError, r'1 <= classes_per_client <= 10 .*got 11'
    ):
      p.label_skew(_labels(), 5, 11, seed=0)

  def test_bad_rule(self):
    with self.assertRaisesRegex(p.PartitionError,
                                'rule must be one of niid_bench, cyclic'):
      p.label_skew(_labels(), 5, 2, seed=0, rule='shards')

  def test_class_with_too_few_examples(self):
    labels = np.array([0] * 50 + [1])
    with self.assertRaisesRegex(p.PartitionError, 'Class 1 has 1 examples'):
      p.label_skew(labels, 4, 2, seed=0)

  @parameterized.parameters('niid_bench', 'cyclic')
  def test_assignment_scheme(self, rule):
    assignment = p.label_skew_assignment(5, 4, 2, seed=0, rule=rule)
    self.assertTrue(all(len(set(a)) == 2 for a in assignment))
    holders = np.bincount(np.concatenate(assignment), minlength=5)
    self.assertEqual(int(holders.sum()), 8)
    if rule == 'cyclic':
      self.assertLessEqual(int(holders.max() - holders.min()), 1)


class NaturalTest(parameterized.TestCase):

  def test_one_client_per_group(self):
    groups = np.array([2, 0, 2, 1, 0, 2])
    clients = p.natural(groups)
    self.assertLen(clients, 3)
    np.testing.assert_array_equal(clients[0], [1, 4])
    np.testing.assert_array_equal(clients[1], [3])
    np.testing.assert_array_equal(clients[2], [0, 2, 5])

  def test_first_and_random_subsets(self):
    groups = np.repeat(np.arange(50), 3)
    first = p.natural(groups, 5)
    self.assertEqual([int(groups[c[0]]) for c in first], [0, 1, 2, 3, 4])
    pick = lambda: [
        int(groups[c[0]]) for c in p.natural(groups, 5, 1, choose='random')
    ]
    chosen = pick()
    self.assertLen(set(chosen), 5)
    self.assertEqual(chosen, sorted(chosen))
    self.assertNotEqual(chosen, [0, 1, 2, 3, 4])
    self.assertEqual(chosen, pick())

  @parameterized.parameters(0, 4)
  def test_bad_num_clients(self, num_clients):
    with self.assertRaisesRegex(p.PartitionError, r'in \[1, 3\]'):
      p.natural(np.array([0, 1, 2]), num_clients)

  def test_bad_choose(self):
    with self.assertRaisesRegex(p.PartitionError, "choose='first' or 'random'"):
      p.natural(np.array([0, 1]), choose='best')


class DispatcherTest(absltest.TestCase):

  def test_registry_names(self):
    self.assertEqual(
        set(p.PARTITIONS),
        {'homogeneous', 'dirichlet', 'quantity_skew', 'label_skew', 'natural'},
    )

  def test_unknown_kind(self):
    with self.assertRaisesRegex(
        p.PartitionError, r"Unknown partition 'iid'. Valid kinds: homogeneous"
    ):
      p.partition('iid', _labels(), 5, seed=0)

  def test_unknown_parameter(self):
    with self.assertRaisesRegex(
        p.PartitionError,
        r"'dirichlet': unknown parameters \['beta'\].*parameters are: alpha",
    ):
      p.partition('dirichlet', _labels(), 5, seed=0, alpha=0.1, beta=1)

  def test_missing_parameter(self):
    with self.assertRaisesRegex(p.PartitionError, r"missing \['kappa', 'm'\]"):
      p.partition('quantity_skew', _labels(), 5, seed=0)

  def test_rules_through_dispatcher(self):
    labels = _labels()
    direct = p.label_skew(labels, 8, 2, seed=4, rule='cyclic')
    dispatched = p.partition('label_skew', labels, 8, seed=4,
                             classes_per_client=2, rule='cyclic')
    for a, b in zip(direct, dispatched):
      np.testing.assert_array_equal(a, b)
    direct = p.quantity_skew(labels, 8, 0.2, 2, seed=4, large_clients='first',
                             kappa_scope='each')
    dispatched = p.partition('quantity_skew', labels, 8, seed=4, kappa=0.2,
                             m=2, large_clients='first', kappa_scope='each')
    for a, b in zip(direct, dispatched):
      np.testing.assert_array_equal(a, b)

  def test_natural_needs_groups(self):
    with self.assertRaisesRegex(p.PartitionError, 'needs groups='):
      p.partition('natural', _labels(), None, seed=0)

  def test_natural_through_dispatcher(self):
    groups = np.array([0, 1, 1, 2])
    clients = p.partition('natural', None, 2, seed=0, groups=groups)
    self.assertLen(clients, 2)

  def test_matches_direct_call(self):
    labels = _labels()
    direct = p.dirichlet(labels, 8, 0.3, seed=4)
    dispatched = p.partition('dirichlet', labels, 8, seed=4, alpha=0.3)
    for a, b in zip(direct, dispatched):
      np.testing.assert_array_equal(a, b)


if __name__ == '__main__':
  absltest.main()
