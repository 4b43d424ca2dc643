"""The experiment a configuration builds: the data it takes."""

from absl.testing import absltest

from tff_fair.training import config as config_lib
from tff_fair.training import experiment as experiment_lib
from tff_fair.training.recipes import registry


def _experiment(**overrides):
  return experiment_lib.build_experiment(registry.make_config(
      dataset='digits', partition='quantity_skew', kappa=0.5,
      quantity_clients=2, num_clients=10, output_dir='unused', **overrides))


class SourceExamplesTest(absltest.TestCase):

  def test_a_subset_keeps_the_quantity_skew(self):
    data = _experiment(source_examples=600).data
    sizes = sorted(sum(data.num_examples(cid, s) for s in ('train',
                                                           'validation',
                                                           'test'))
                   for cid in data.client_ids)
    self.assertEqual(sum(sizes), 600)
    # Two clients share half the examples; the eight others the rest.
    self.assertAlmostEqual(sum(sizes[-2:]), 300, delta=2)
    # A per-client cap would have made them equal instead.
    capped = _experiment(examples_per_client=60).data
    self.assertEqual({capped.num_examples(cid, 'train')
                      for cid in capped.client_ids},
                     {capped.num_examples(capped.client_ids[0], 'train')})

  def test_a_negative_subset_is_refused(self):
    with self.assertRaisesRegex(config_lib.ConfigError,
                                'source_examples must be >= 0'):
      _experiment(source_examples=-1)


if __name__ == '__main__':
  absltest.main()
