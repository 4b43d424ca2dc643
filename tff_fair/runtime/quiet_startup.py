"""Keeps TensorFlow's start-up chatter out of a user's terminal.

The PyPI builds of TensorFlow 2.14 and of TFF's worker print lines at every
start and every round that are not the user's concern: CUDA plug-ins that
cannot register on a machine without CUDA, the CPU-instructions notice,
grappler's session lines, TensorRT's absence, and grappler's "Optimization
loop failed: CANCELLED" (a per-function optimizer deadline; the function
then runs unoptimized, with the same results). Only those exact lines are
dropped: every other warning and error still reaches stderr.

Programs and benchmarks call `import_tensorflow_quietly()` before anything
imports TensorFlow; the local worker launcher passes its worker's output
through `forward_filtered`. Plain Python: importing this module imports no
TensorFlow.
"""

import contextlib
import os
import re
import sys
import tempfile
import threading
from typing import BinaryIO, Iterator, TextIO

# C++ log levels: 0 all, 1 hides INFO (grappler session lines, the CPU
# instruction notice, "could not find cuda drivers"), 2 hides WARNING too.
_CPP_MIN_LOG_LEVEL = '1'

_HARMLESS = re.compile(
    r'Unable to register (cuDNN|cuFFT|cuBLAS) factory'
    r'|TF-TRT Warning: Could not find TensorRT'
    r'|Optimization loop failed: CANCELLED'
    r'|All log messages before absl::InitializeLog\(\) is called'
)


def is_harmless(line: str) -> bool:
  """True for a known start-up line that says nothing about this run."""
  return bool(_HARMLESS.search(line))


def quiet_environment() -> None:
  """Sets TensorFlow's C++ log level for this process and its workers.

  A level the user set explicitly (TF_CPP_MIN_LOG_LEVEL) is kept.
  """
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', _CPP_MIN_LOG_LEVEL)


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
  """Drops harmless lines from what is written to descriptor 2 meanwhile.

  TensorFlow's C++ runtime writes to file descriptor 2 directly, so
  Python's `sys.stderr` cannot filter it: descriptor 2 goes to a temporary
  file for the duration, and every line not known to be harmless is written
  back at the end (also when the body raises).
  """
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as capture:
    os.dup2(capture.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      capture.seek(0)
      text = capture.read().decode('utf-8', errors='replace')
      sys.stderr.writelines(
          line for line in text.splitlines(keepends=True)
          if not is_harmless(line))
      sys.stderr.flush()


def import_tensorflow_quietly() -> None:
  """Imports TensorFlow and TFF without their start-up noise."""
  quiet_environment()
  if 'tensorflow' in sys.modules:
    return
  with filtered_stderr():
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
    import tensorflow_federated  # pylint: disable=g-import-not-at-top,unused-import


def forward_filtered(source: BinaryIO, sink: TextIO) -> threading.Thread:
  """Copies `source` to `sink` line by line, less harmless lines.

  Args:
    source: A binary stream, e.g. a worker process's stdout pipe.
    sink: Where the kept lines go (e.g. sys.stderr).

  Returns:
    The daemon thread doing the copying; it ends at the source's EOF.
  """

  def copy():
    with source:
      for raw in iter(source.readline, b''):
        line = raw.decode('utf-8', errors='replace')
        if not is_harmless(line):
          sink.write(line)
          sink.flush()

  thread = threading.Thread(target=copy, name='worker-output', daemon=True)
  thread.start()
  return thread
