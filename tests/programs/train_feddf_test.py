"""FedDF through the real train program: a run of two architectures, and
its bad inputs refused with exit status 2."""

import csv
import os

from absl.testing import absltest
from absl.testing import parameterized

from tests import tff_test_utils

_FEDDF = dict(algorithm='feddf', client_models='lenet:0.5,ditto_cnn:0.5',
              public_examples=200, server_held_out_examples=100,
              examples_per_client=100, clients_per_round=4, rounds=2,
              feddf_distillation_steps=20,
              feddf_validate_every=10)


class TrainFedDFTest(parameterized.TestCase):

  def test_two_architectures_run_end_to_end(self):
    out = os.path.join(self.create_tempdir().full_path, 'run')
    result = tff_test_utils.run_module(
        tff_test_utils.train_command(out, **_FEDDF))
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('teacher_val_acc=', result.stderr)
    with open(os.path.join(out, 'feddf_distillation.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertEqual([(r['round'], r['architecture']) for r in rows],
                     [('1', 'lenet'), ('1', 'ditto_cnn'),
                      ('2', 'lenet'), ('2', 'ditto_cnn')])
    self.assertEqual(sum(int(r['clients']) for r in rows[:2]), 4)
    with open(os.path.join(out, 'clients_final.csv')) as f:
      final = list(csv.DictReader(f))
    self.assertLen([r for r in final if r['model'] == 'global'], 4)

  @parameterized.named_parameters(
      ('no_public_set', dict(public_examples=0), ['--public_examples=N']),
      ('no_validation_set', dict(server_held_out_examples=0),
       ['--server_held_out_examples=N']),
      ('model_not_among_them', dict(client_models='ditto_cnn'),
       ['--model=lenet is not one of --client_models=ditto_cnn']),
      ('unknown_architecture', dict(client_models='lenet,resnet'),
       ["unknown architecture 'resnet'"]),
      ('public_set_too_large', dict(public_examples=5000),
       ['public_examples=5000 needs 5000 examples']),
  )
  def test_bad_inputs_exit_2_with_one_message(self, overrides, keywords):
    out = os.path.join(self.create_tempdir().full_path, 'run')
    result = tff_test_utils.run_module(
        tff_test_utils.train_command(out, **{**_FEDDF, **overrides}))
    tff_test_utils.assert_refused(self, result, keywords, out)


if __name__ == '__main__':
  absltest.main()
