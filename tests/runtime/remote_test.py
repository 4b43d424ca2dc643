"""The remote executor stack on loopback workers started like users do."""

import dataclasses
import signal
import subprocess
import time

from absl.testing import absltest
import numpy as np
import portpicker
import tensorflow_federated as tff

from tests import tff_test_utils
from tff_fair.runtime import execution
from tff_fair.runtime import remote
from tff_fair.training import driver
from tff_fair.training.recipes import registry


def _client_values_identity():
  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def identity(values):
    return values
  return identity


def _add_server_value():
  """(<s@SERVER, {c}@CLIENTS> -> {s + c}@CLIENTS), a per-client map."""
  add = tff.tensorflow.computation(lambda a, b: a + b, np.float32, np.float32)

  @tff.federated_computation(tff.FederatedType(np.float32, tff.SERVER),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def add_to_clients(server_value, client_values):
    return tff.federated_map(add, (tff.federated_broadcast(server_value),
                                   client_values))
  return add_to_clients


def _client_sum():
  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def total(values):
    return tff.federated_sum(values)
  return total


class ParseWorkersTest(absltest.TestCase):

  def test_parses_hosts_and_ports(self):
    self.assertEqual(
        remote.parse_workers('a:1, 10.0.0.2:8000,[::1]:9'),
        [remote.WorkerAddress('a', 1), remote.WorkerAddress('10.0.0.2', 8000),
         remote.WorkerAddress('::1', 9)])

  def test_bad_specs_say_what_is_wrong(self):
    for spec, message in [('', 'empty'), ('host', 'not host:port'),
                          ('h:0', 'not host:port'), ('h:x', 'not host:port'),
                          ('h:1,h:1', 'twice')]:
      with self.subTest(spec=spec):
        with self.assertRaisesRegex(remote.ExecutorConfigError, message):
          remote.parse_workers(spec)

  def test_executor_flags_are_checked_before_connecting(self):
    with self.assertRaisesRegex(remote.ExecutorConfigError, 'needs --workers'):
      with execution.execution_context('remote', ''):
        pass
    with self.assertRaisesRegex(remote.ExecutorConfigError,
                                'needs --executor=remote'):
      with execution.execution_context('local', 'h:1'):
        pass


class RemoteRuntimeTest(absltest.TestCase):

  def _worker(self, port=None):
    port = port or portpicker.pick_unused_port()
    process = tff_test_utils.start_worker(port)
    self.addCleanup(tff_test_utils.stop_worker, process)
    return process, remote.WorkerAddress('localhost', port)

  def test_launcher_refuses_a_busy_port_and_a_bad_binary(self):
    _, address = self._worker()
    second = subprocess.run(
        tff_test_utils.module_command('programs.worker', port=address.port),
        capture_output=True, text=True, env=tff_test_utils.subprocess_env(),
        timeout=60, check=False)
    self.assertNotEqual(second.returncode, 0)
    self.assertIn(f'Port {address.port} is in use', second.stderr)
    missing = subprocess.run(
        tff_test_utils.module_command(
            'programs.worker', port=portpicker.pick_unused_port(),
            worker_binary='/nonexistent/worker_binary'),
        capture_output=True, text=True, env=tff_test_utils.subprocess_env(),
        timeout=60, check=False)
    self.assertEqual(missing.returncode, 2)
    self.assertIn('is not an executable file', missing.stderr)

  def test_unreachable_worker_fails_fast_and_is_named(self):
    _, live = self._worker()
    dead = remote.WorkerAddress('localhost', portpicker.pick_unused_port())
    start = time.monotonic()
    with self.assertRaisesRegex(remote.WorkerUnavailableError,
                                f'{dead}.*did not accept a connection'):
      with remote.remote_context([live, dead], connect_timeout_seconds=3):
        pass
    self.assertLess(time.monotonic() - start, 30)

  def test_frozen_worker_is_detected_not_waited_for(self):
    process, address = self._worker()
    total = _client_sum()
    with remote.remote_context([address], monitor_interval_seconds=1):
      self.assertEqual(total([1.0, 2.0]), 3.0)
      process.send_signal(signal.SIGSTOP)  # Alive, connected, silent.
      start = time.monotonic()
      with self.assertRaisesRegex(remote.WorkerUnavailableError,
                                  f'{address} did not answer'):
        total([1.0, 2.0])
      self.assertLess(time.monotonic() - start, 30)

  def test_two_workers_match_local_runtime_and_end_cleanly(self):
    workers = [self._worker() for _ in range(2)]
    spec = ','.join(str(address) for _, address in workers)
    for algorithm in ('fedavg', 'ditto'):
      config = registry.make_config(
          algorithm=algorithm, dataset='digits', partition='dirichlet',
          num_clients=6, clients_per_round=4, rounds=2, batch_size=16,
          client_learning_rate=0.1, seed=5, output_dir='unset')
      results = {}
      for executor, workers_flag in (('local', ''), ('remote', spec)):
        with execution.execution_context(executor, workers_flag):
          results[executor] = driver.run(dataclasses.replace(
              config, output_dir=self.create_tempdir().full_path))
      local, distributed = results['local'], results['remote']
      with self.subTest(algorithm=algorithm):
        self.assertLen(distributed.history, 2)
        for a, b in zip(local.history, distributed.history):
          keys = sorted(k for k in a if not k.startswith('seconds'))
          self.assertContainsSubset(['train_loss', 'test_accuracy_mean'], keys)
          np.testing.assert_allclose([a[k] for k in keys],
                                     [b[k] for k in keys], rtol=1e-4,
                                     atol=1e-6, err_msg=str(keys))
        self.assertEqual(local.evaluations.keys(),
                         distributed.evaluations.keys())
        for kind, metrics in local.evaluations.items():
          np.testing.assert_allclose(
              [m.accuracy for m in metrics.values()],
              [m.accuracy for m in distributed.evaluations[kind].values()],
              atol=1e-6)

    with remote.remote_context(
        [address for _, address in workers], reconnect_seconds=2):
      # Client-placed results cannot be merged: refused, with the way out.
      with self.assertRaisesRegex(ValueError, 'map_clients'):
        _client_values_identity()([1.0, 2.0, 3.0])
      # map_clients shards clients over the workers and keeps their order.
      self.assertEqual(
          remote.map_clients(_add_server_value(), 10.0, [1., 2., 3., 4., 5.]),
          [11., 12., 13., 14., 15.])
      lost_process, lost = workers[1]
      lost_process.kill()
      lost_process.wait()
      start = time.monotonic()
      with self.assertRaisesRegex(remote.WorkerUnavailableError,
                                  f'{lost} stopped answering'):
        _client_sum()([1.0, 2.0, 3.0, 4.0])
      self.assertLess(time.monotonic() - start, 30)


if __name__ == '__main__':
  absltest.main()
