"""FedMD through the real train program: a run of two architectures, and
its bad inputs refused with exit status 2."""

import csv
import os

from absl.testing import absltest
from absl.testing import parameterized

from tests import tff_test_utils

_FEDMD = dict(algorithm='fedmd', client_models='lenet:0.5,ditto_cnn:0.5',
              public_examples=200, fedmd_alignment_examples=100,
              fedmd_pretrain_epochs=2, examples_per_client=100,
              clients_per_round=4, rounds=2)


class TrainFedMDTest(parameterized.TestCase):

  def test_two_architectures_run_end_to_end(self):
    out = os.path.join(self.create_tempdir().full_path, 'run')
    result = tff_test_utils.run_module(
        tff_test_utils.train_command(out, **_FEDMD))
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('consensus_clients=4', result.stderr)
    with open(os.path.join(out, 'fedmd_rounds.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertEqual([r['round'] for r in rows], ['1'] * 4 + ['2'] * 4)
    self.assertEqual({r['architecture'] for r in rows},
                     {'lenet', 'ditto_cnn'})
    for name in ('lenet', 'ditto_cnn'):
      self.assertTrue(os.listdir(os.path.join(out, 'fedmd_models', name)))
    with open(os.path.join(out, 'clients_final.csv')) as f:
      final = list(csv.DictReader(f))
    self.assertEqual({r['model'] for r in final}, {'personalized'})
    self.assertLen(final, 4)

  @parameterized.named_parameters(
      ('no_public_set', dict(public_examples=0), ['--public_examples=N']),
      ('alignment_past_the_public_set', dict(fedmd_alignment_examples=500),
       ['--fedmd_alignment_examples=500', '--public_examples=200']),
      ('server_optimizer', dict(server_optimizer='adam'),
       ['--server_optimizer=adam would be ignored', 'fedmd']),
  )
  def test_bad_inputs_exit_2_with_one_message(self, overrides, keywords):
    out = os.path.join(self.create_tempdir().full_path, 'run')
    result = tff_test_utils.run_module(
        tff_test_utils.train_command(out, **{**_FEDMD, **overrides}))
    tff_test_utils.assert_refused(self, result, keywords, out)


if __name__ == '__main__':
  absltest.main()
