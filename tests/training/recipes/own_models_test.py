"""What the recipes with per-client personal models release of them."""

import math

from absl.testing import absltest

from tff_fair.training.recipes import own_models


class PersonalTrainStatisticsTest(absltest.TestCase):

  def test_mean_and_worst_client(self):
    released = own_models.personal_train_statistics([
        {'train_loss': 0.5, 'train_accuracy': 0.9},
        {'train_loss': 2.5, 'train_accuracy': 0.1},
    ])
    self.assertEqual(released, {
        'personal_train_loss_mean': 1.5, 'personal_train_loss_max': 2.5,
        'personal_train_accuracy_mean': 0.5,
        'personal_train_accuracy_min': 0.1})

  def test_a_diverged_personal_model_shows_and_does_not_stop_the_round(self):
    # Seen in Ditto under heavy DP noise: the global model diverges and a
    # personal model drawn towards it follows.
    released = own_models.personal_train_statistics([
        {'train_loss': 0.5, 'train_accuracy': 0.9},
        {'train_loss': math.nan, 'train_accuracy': 0.0},
        {'train_loss': math.inf, 'train_accuracy': 0.3},
    ])
    self.assertTrue(math.isnan(released['personal_train_loss_mean']))
    self.assertTrue(math.isnan(released['personal_train_loss_max']))
    self.assertEqual(released['personal_train_accuracy_min'], 0.0)
    self.assertAlmostEqual(released['personal_train_accuracy_mean'], 0.4)


if __name__ == '__main__':
  absltest.main()
