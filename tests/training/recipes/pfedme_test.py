"""pFedMe in the driver: settings, personalized models, exact resume."""


import tensorflow as tf

from tests import tff_test_utils
from tests.training.recipes import recipe_test_utils
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training.recipes import pfedme
from tff_fair.training.recipes import registry


def _config(output_dir, **overrides):
  return recipe_test_utils.digits_config(
      output_dir, **{'algorithm': 'pfedme', **overrides})


def _rows(output_dir):
  return recipe_test_utils.read_round_log(output_dir, pfedme.ROUND_LOG)


class PFedMeSettingsTest(tf.test.TestCase):

  def test_bad_settings_are_refused_naming_the_flags(self):
    out = self.create_tempdir().full_path
    for overrides, message in (
        (dict(pfedme_lambda=-1.0),
         '--pfedme_lambda must be a finite number > 0'),
        (dict(pfedme_inner_steps=0), '--pfedme_inner_steps must be an int'),
        (dict(pfedme_personal_learning_rate=-0.1),
         '--pfedme_personal_learning_rate must be a finite number > 0'),
        (dict(pfedme_lambda=30.0, pfedme_personal_learning_rate=0.09),
         r'--pfedme_personal_learning_rate=0.09 with --pfedme_lambda=30.0:'
         r' p_lr \* lambda = 2.7 must be < 2.*below 0.0667'),
        # The default lambda at the client rate 0.05 is 15: 0.2 * 15 = 3.
        (dict(pfedme_personal_learning_rate=0.2, client_learning_rate=0.05),
         r'--pfedme_personal_learning_rate=0.2 with --pfedme_lambda=15.0:'
         r' p_lr \* lambda = 3 must be < 2'),
        (dict(client_learning_rate=0.2, pfedme_lambda=15.0),
         r"--client_learning_rate=0.2 with --pfedme_lambda=15.0: the local"
         r" model's step eta \* lambda = 3 must be < 2.*below 0.133"),
        (dict(personal_iterate='best'), 'Unknown personal_iterate'),
        (dict(client_optimizer='sgdm'),
         '--client_optimizer=sgdm would be ignored: --algorithm=pfedme reads'
         ' --client_optimizer only as sgd'),
    ):
      with self.subTest(overrides), self.assertRaisesRegex(
          config_lib.ConfigError, message):
        _config(out, **overrides)

  def test_defaults_follow_the_client_learning_rate(self):
    out = self.create_tempdir().full_path
    # lambda: the paper's 15 where eta * 15 <= 0.75, else 0.75 / eta; p_lr:
    # 1 / (lambda + 2 / eta). config.json records the values used.
    for dataset, rate, lam, personal_rate in (
        ('fashion_mnist', 0.0, 15.0, 1 / 55), ('digits', 0.0, 7.5, 1 / 27.5),
        ('digits', 0.01, 15.0, 1 / 215), ('shakespeare', 0.0, 0.75, 1 / 2.75),
    ):
      config = registry.make_config(
          algorithm='pfedme', dataset=dataset, client_learning_rate=rate,
          output_dir=out)
      self.assertEqual(config.settings.pfedme_lambda, lam)
      self.assertAlmostEqual(config.settings.pfedme_personal_learning_rate,
                             personal_rate)
      self.assertEqual(config.to_dict()['pfedme_lambda'], lam)
    # Given values are kept.
    config = _config(out, pfedme_lambda=2.0,
                     pfedme_personal_learning_rate=0.5)
    self.assertEqual((config.settings.pfedme_lambda,
                      config.settings.pfedme_personal_learning_rate),
                     (2.0, 0.5))


class PFedMeRunTest(tff_test_utils.TffTestCase):

  def test_personalized_models_and_exact_resume(self):
    # 2 of 4 clients a round: some end with a theta of an earlier round,
    # read back from the store (after the resume, from before the kill).
    straight_dir = self.create_tempdir().full_path
    straight = driver.run(_config(straight_dir, clients_per_round=2))
    rows = _rows(straight_dir)
    self.assertLen(rows, 3 * 2)
    last_round = {r['client']: int(r['round']) for r in rows}
    self.assertLen(last_round, 4)
    self.assertLess(min(last_round.values()), 3)
    # 'validated': each client's theta or the global model, by validation.
    self.assertCountEqual(straight.evaluations,
                          ['global', 'personalized', 'validated'])
    # Each client's theta is its own, not the global model.
    for cid, personal in straight.evaluations['personalized'].items():
      self.assertNotAlmostEqual(
          personal.loss, straight.evaluations['global'][cid].loss, places=3)
    # Benign clients' personalized training accuracy is released.
    self.assertIn('personal_train_accuracy_min', straight.history[-1])
    (poisoned,) = straight.malicious
    for row in rows:
      self.assertEqual(row['malicious'], str(int(row['client'] == poisoned)))

    # Killed in round 3 after its personalized models were written but
    # before they were committed with the checkpoint: the resumed run
    # starts from round 2's models and ends where the straight one did.
    split_dir = self.create_tempdir().full_path
    with self.assertRaises(recipe_test_utils.Killed):
      recipe_test_utils.run_keeping_state(
          pfedme.PFedMe, _config(split_dir, clients_per_round=2),
          kill_in_round=3)
    resumed = driver.run(_config(split_dir, clients_per_round=2))
    self.assertEqual(resumed.resumed_from_round, 2)
    # Exactly: the same computations on the same inputs.
    self.assertEqual(_rows(split_dir), rows)
    self.assertEqual(resumed.evaluations, straight.evaluations)


if __name__ == '__main__':
  tf.test.main()
