"""What a run on two remote workers guarantees, over 10 rounds of Ditto.

Several workers add up partial aggregates in another order than the local
runtime, so their numbers may drift from a local run's over rounds (README,
"Remote workers"). What is guaranteed, and tested here on two loopback
workers: the same command on the same workers gives the same numbers, and
a run interrupted at a checkpoint and resumed on them ends exactly as the
uninterrupted one.
"""

from absl.testing import absltest
import numpy as np
import portpicker

from tests import tff_test_utils
from tff_fair.runtime import execution
from tff_fair.runtime import remote
from tff_fair.training import config as config_lib
from tff_fair.training import driver

_ROUNDS = 10


class TwoWorkerGuaranteeTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    addresses = []
    for _ in range(2):
      port = portpicker.pick_unused_port()
      process = tff_test_utils.start_worker(port)
      self.addCleanup(tff_test_utils.stop_worker, process)
      addresses.append(str(remote.WorkerAddress('localhost', port)))
    self.workers = ','.join(addresses)

  def _run(self, rounds: int, output_dir: str) -> driver.RunResult:
    config = config_lib.RunConfig(
        algorithm='ditto', dataset='digits', partition='dirichlet',
        num_clients=6, clients_per_round=4, rounds=rounds, batch_size=16,
        client_learning_rate=0.1, seed=5, eval_every=0,
        output_dir=output_dir)
    with execution.execution_context('remote', self.workers):
      return driver.run(config)

  def test_repeatable_and_resumable_on_the_same_workers(self):
    first = self._run(_ROUNDS, self.create_tempdir().full_path)
    split_dir = self.create_tempdir().full_path
    interrupted = self._run(_ROUNDS // 2, split_dir)
    resumed = self._run(_ROUNDS, split_dir)
    self.assertEqual(resumed.resumed_from_round, _ROUNDS // 2)

    def losses(*results):
      return [h['train_loss'] for r in results for h in r.history]

    self.assertLen(first.history, _ROUNDS)
    # Exactly equal, not to a tolerance: rounds 1-5 repeat the same command
    # on the same workers, rounds 6-10 come from a resumed run.
    self.assertEqual(losses(first), losses(interrupted, resumed))
    for kind in ('global', 'personalized'):
      np.testing.assert_array_equal(
          [m.accuracy for m in first.evaluations[kind].values()],
          [m.accuracy for m in resumed.evaluations[kind].values()],
          err_msg=kind)
    # And the run learned something: equal numbers of nothing prove nothing.
    self.assertLess(losses(first)[-1], losses(first)[0])

if __name__ == '__main__':
  absltest.main()
