"""The attacks' plain-numpy part: names, malicious clients, poisoned labels."""

import subprocess
import sys

from absl.testing import absltest
import numpy as np

from tff_fair import attacks


class AttacksTest(absltest.TestCase):

  def test_choose_malicious_is_seeded_and_rounds_the_fraction(self):
    ids = [f'client_{i}' for i in range(10)]
    config = attacks.AttackConfig(attacks.RANDOM_UPDATES, 0.24, seed=3)
    chosen = attacks.choose_malicious(ids, config)
    self.assertLen(chosen, 2)
    self.assertEqual(chosen, attacks.choose_malicious(ids, config))
    self.assertEmpty(attacks.choose_malicious(ids, attacks.AttackConfig()))

  def test_random_labels_are_fixed_per_client(self):
    labels = np.zeros(50, np.int32)
    first = attacks.noisy_labels(labels, 10, 1.0, seed=1, client_index=2)
    self.assertEqual(first.dtype, np.int32)
    np.testing.assert_array_equal(
        first, attacks.noisy_labels(labels, 10, 1.0, seed=1, client_index=2))
    self.assertFalse(np.array_equal(
        first, attacks.noisy_labels(labels, 10, 1.0, seed=1, client_index=3)))

  def test_noisy_labels_replace_the_fraction_asked(self):
    labels = np.full(1000, 11, np.int64)  # A class no random label takes.
    for fraction in (0.0, 0.25, 0.5):
      noisy = attacks.noisy_labels(labels, 10, fraction, seed=1,
                                   client_index=0)
      self.assertEqual(np.sum(noisy != labels), round(fraction * 1000))
      self.assertTrue(np.all(noisy[noisy != labels] < 10))
    # Fraction 1 replaces every label (A1, a free rider).
    everything = attacks.noisy_labels(labels, 10, 1.0, seed=1,
                                      client_index=0)
    self.assertTrue(np.all(everything < 10))

  def test_config_refuses_an_attack_without_malicious_clients(self):
    with self.assertRaisesRegex(ValueError, 'needs malicious_fraction > 0'):
      attacks.AttackConfig(attacks.LABEL_POISONING)
    with self.assertRaisesRegex(ValueError, 'Unknown attack'):
      attacks.AttackConfig('backdoor', 0.1)

  def test_imports_no_tensorflow(self):
    code = ('import sys\nimport tff_fair.attacks\n'
            'print("tensorflow" in sys.modules)')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                            text=True, check=True, timeout=60)
    self.assertEqual(result.stdout.strip(), 'False')


if __name__ == '__main__':
  absltest.main()
