"""The privacy accounting: dp_accounting's RDP accountant for the run's
sampling, a published value reproduced, and the budget search."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant

from tff_fair.privacy import accounting


def _direct_epsilon(noise, clients_per_round, num_clients, rounds, delta):
  """dp_accounting called directly: `rounds` Gaussian mechanisms on samples
  of `clients_per_round` of `num_clients` drawn without replacement."""
  accountant = rdp_privacy_accountant.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  accountant.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(
          num_clients, clients_per_round,
          dp_accounting.GaussianDpEvent(noise)), rounds))
  return accountant.get_epsilon(delta)


class AccountingTest(parameterized.TestCase):

  @parameterized.parameters(
      (1.0, 50, 1000, 100, 1e-4),
      (0.6, 10, 500, 30, 1e-3),
      (2.5, 100, 3383, 1500, 1 / 3383**1.1),
  )
  def test_epsilon_is_dp_accountings_for_the_run_s_sampling(
      self, noise, clients_per_round, num_clients, rounds, delta):
    got = accounting.epsilon(noise, clients_per_round, num_clients, rounds,
                             delta)
    want = _direct_epsilon(noise, clients_per_round, num_clients, rounds,
                           delta)
    self.assertGreater(got, 0)
    self.assertLess(abs(got - want), 1e-6 * want)

  def test_every_client_every_round_is_the_plain_gaussian_mechanism(self):
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(1.5), 20)
    self.assertAlmostEqual(accounting.epsilon(1.5, 20, 20, 20, 1e-3),
                           accountant.get_epsilon(1e-3))
    self.assertEqual(accounting.epsilon(1.5, 20, 20, 0, 1e-3), 0.0)

  def test_the_accountant_reproduces_tf_privacy_s_published_epsilons(self):
    # TensorFlow Privacy's MNIST DP-SGD tutorial (tensorflow/privacy,
    # tutorials/README.md, "Select Parameters"): 60,000 examples, batch
    # 256, noise 1.12 for 60 epochs, 1.2 for 10 and 0.6 for 30 give
    # epsilon 2.92, 1.20 and 9.74 at delta 1e-5 (Poisson sampling; the RDP
    # orders 1.1..10.9 and 12..63, and RDP's classic conversion
    # eps = min over orders of rdp + log(1/delta) / (order - 1)). The RDP
    # curve this module's accountant composes reproduces them; the epsilon
    # it reports converts that curve by dp_accounting's tighter rule.
    orders = [1 + x / 10 for x in range(1, 100)] + list(range(12, 64))
    for noise, epochs, published in ((1.12, 60, 2.92), (1.2, 10, 1.20),
                                     (0.6, 30, 9.74)):
      accountant = rdp_privacy_accountant.RdpAccountant(orders)
      accountant.compose(dp_accounting.PoissonSampledDpEvent(
          256 / 60000, dp_accounting.GaussianDpEvent(noise)),
                         epochs * 60000 // 256)
      # pylint: disable=protected-access (the RDP curve itself)
      rdp = accountant._rdp
      classic = min(r + math.log(1 / 1e-5) / (order - 1)
                    for r, order in zip(rdp, orders))
      self.assertAlmostEqual(classic, published, delta=0.015)
      self.assertLessEqual(accountant.get_epsilon(1e-5), classic)

  def test_more_rounds_or_clients_cost_more_more_noise_less(self):
    base = accounting.epsilon(1.0, 20, 1000, 50, 1e-4)
    self.assertGreater(accounting.epsilon(1.0, 20, 1000, 100, 1e-4), base)
    self.assertGreater(accounting.epsilon(1.0, 40, 1000, 50, 1e-4), base)
    self.assertLess(accounting.epsilon(1.5, 20, 1000, 50, 1e-4), base)

  @parameterized.parameters((1.0,), (3.0,), (8.0,))
  def test_the_budget_search_lands_within_2_percent_below(self, target):
    noise = accounting.noise_for_epsilon(target, 100, 1000, 100, 1e-4)
    spent = accounting.epsilon(noise, 100, 1000, 100, 1e-4)
    self.assertLessEqual(spent, target)
    self.assertGreater(spent, 0.98 * target)
    # The smallest such noise: a little less overspends.
    self.assertGreater(
        accounting.epsilon(0.99 * noise, 100, 1000, 100, 1e-4), target)

  def test_impossible_budgets_and_bad_settings_are_refused(self):
    with self.assertRaisesRegex(ValueError,
                                'cannot be reached in 200 rounds of 5 of'):
      accounting.noise_for_epsilon(1.0, 5, 1000, 200, 1e-4)
    with self.assertRaisesRegex(ValueError, 'dp_target_epsilon must be'):
      accounting.noise_for_epsilon(0.0, 5, 1000, 200, 1e-4)
    with self.assertRaisesRegex(ValueError, r'dp_delta must be in \(0,'):
      accounting.epsilon(1.0, 5, 100, 10, 0.01)
    with self.assertRaisesRegex(ValueError, r'dp_noise_multiplier must be in'
                                r' \[0, 0.5\) with clients_per_round=5'):
      accounting.epsilon(0.5, 5, 100, 10, 1e-3)
    # No noise (the DP aggregator only clips): no privacy.
    self.assertEqual(accounting.epsilon(0.0, 5, 100, 10, 1e-3), math.inf)
    self.assertLess(accounting.default_delta(100), 1 / 100)

  @parameterized.parameters((1.0, 50), (4.81, 50), (0.5, 10))
  def test_update_noise_is_what_tff_puts_on_the_updates(
      self, noise_multiplier, clients_per_round):
    # Imported here: the rest of the accounting needs no TFF.
    from tensorflow_federated.python.aggregators import differential_privacy  # pylint: disable=g-import-not-at-top
    expected, _ = differential_privacy.adaptive_clip_noise_params(
        noise_multiplier, clients_per_round)
    got = accounting.update_noise_multiplier(noise_multiplier,
                                             clients_per_round)
    self.assertAlmostEqual(got, expected, delta=1e-9 * expected)
    self.assertGreater(got, noise_multiplier)


if __name__ == '__main__':
  absltest.main()
