"""Tests for tff_fair.runtime.quiet_startup: noise dropped, errors kept."""

import io
import os
import subprocess
import sys

from absl.testing import absltest

from tff_fair.runtime import quiet_startup

_NOISE = (
    '2026-12-01 07:23:23.042097: E tensorflow/compiler/xla/stream_executor/'
    'cuda/cuda_dnn.cc:9342] Unable to register cuDNN factory: Attempting to'
    ' register factory for plugin cuDNN when one has already been registered\n',
    '2026-12-01 07:23:34.486224: W tensorflow/compiler/tf2tensorrt/utils/'
    'py_utils.cc:38] TF-TRT Warning: Could not find TensorRT\n',
    '2026-12-01 07:25:31.0: W tensorflow/core/grappler/optimizers/'
    'meta_optimizer.cc:961] model_pruner failed: ... Optimization loop failed:'
    ' CANCELLED: Operation was cancelled\n',
)
_REAL = (
    '2026-12-01 07:25:31.0: E tensorflow/core/framework/op_kernel.cc:1] OOM'
    ' when allocating tensor\n',
    'Traceback (most recent call last):\n',
)


def _stderr_of(code: str) -> str:
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  return subprocess.run([sys.executable, '-c', code], env=env, check=True,
                        capture_output=True, text=True, timeout=240).stderr


class QuietStartupTest(absltest.TestCase):

  def test_forward_filtered_drops_noise_only(self):
    source = io.BytesIO(''.join(_NOISE[:1] + _REAL[:1] + _NOISE[1:] +
                                _REAL[1:]).encode())
    sink = io.StringIO()
    quiet_startup.forward_filtered(source, sink).join(timeout=10)
    self.assertEqual(sink.getvalue(), ''.join(_REAL))

  def test_filtered_stderr_drops_noise_only(self):
    lines = _NOISE[:1] + _REAL[:1] + _NOISE[1:] + _REAL[1:]
    stderr = _stderr_of(
        'import os\n'
        'from tff_fair.runtime import quiet_startup\n'
        'with quiet_startup.filtered_stderr():\n'
        f'  os.write(2, {"".join(lines).encode()!r})\n'
        'os.write(2, b"after\\n")\n')
    self.assertEqual(stderr, ''.join(_REAL) + 'after\n')

  def test_import_drops_tensorflow_startup_noise(self):
    # The plain import prints the noise on this build, so the check below
    # has something to remove.
    plain = _stderr_of('import tensorflow')
    self.assertRegex(plain, 'Unable to register cu(DNN|FFT|BLAS) factory'
                     '|cpu_feature_guard')
    quiet = _stderr_of(
        'from tff_fair.runtime import quiet_startup\n'
        'quiet_startup.import_tensorflow_quietly()\n'
        'import tensorflow as tf\n'
        'tf.constant(1.0) + 1.0\n')
    self.assertNotRegex(quiet, 'Unable to register|cpu_feature_guard|'
                        'Could not find cuda drivers')

  def test_explicit_log_level_is_kept(self):
    os.environ['TF_CPP_MIN_LOG_LEVEL'] = '0'
    try:
      quiet_startup.quiet_environment()
      self.assertEqual(os.environ['TF_CPP_MIN_LOG_LEVEL'], '0')
    finally:
      del os.environ['TF_CPP_MIN_LOG_LEVEL']
    quiet_startup.quiet_environment()
    self.assertEqual(os.environ['TF_CPP_MIN_LOG_LEVEL'], '1')
    del os.environ['TF_CPP_MIN_LOG_LEVEL']


if __name__ == '__main__':
  absltest.main()
