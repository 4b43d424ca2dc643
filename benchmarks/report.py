"""A benchmark's results as one JSON file, the source of the docs' tables.

Every benchmark in this folder takes `--results_file`; when it is given, the
benchmark writes there what it printed, in one schema:

    {
      "benchmark": "ditto_fmnist",              # the module's name
      "command": "python -m benchmarks.ditto_fmnist --output_dir=...",
      "settings": {"rounds": 50, ...},          # its flags' values
      "machine": {"cpu": "...", "cores": 2, "memory_gib": 23.4},
      "record_machines": [...],  # other machines, of run records read back
      "load_average": {"mean": 1.9, "max": 2.3},  # 1-min, sampled every 5 s
      "wall_seconds": 3012.5,                   # of the whole benchmark
      "tables": {
        "<table>": {
          "title": "...",
          "columns": [{"key": "mean", "title": "mean acc.",
                       "format": ".4f"}, ...],
          "rows": [{"method": "...", "mean": 0.95, ...}, ...]
        }
      }
    }

A row holds plain values under the columns' keys (None where a value does
not apply); `format` is a Python format spec ('' for text). The tables in
docs/benchmarks.md are rendered from the committed files under
benchmarks/results/ by `python -m tools.render_docs`.

Plain Python, no TensorFlow.
"""

from collections.abc import Mapping, Sequence
import dataclasses
import json
import math
import os
import sys
import threading
import time
from typing import Any, Optional

from tff_fair import files

# The folder of the committed results: benchmarks/results/<name>.json.
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           'results')
_LOAD_SAMPLE_SECONDS = 5.0
# The machines of the run records (benchmarks/run_records.py) this process
# read: a table built across sessions holds figures measured on them.
_RECORD_MACHINES: list[dict[str, Any]] = []


@dataclasses.dataclass(frozen=True)
class Column:
  """One column of a results table.

  Attributes:
    key: The rows' key holding its values.
    title: Its heading in the docs.
    format: A Python format spec for its values ('' for text).
  """
  key: str
  title: str
  format: str = ''


def machine() -> dict[str, Any]:
  """The CPU model, its cores and the memory of this machine (Linux)."""
  cpu = ''
  try:
    with open('/proc/cpuinfo') as f:
      cpu = next((line.split(':', 1)[1].strip() for line in f
                  if line.startswith('model name')), '')
    with open('/proc/meminfo') as f:
      kib = next(int(line.split()[1]) for line in f
                 if line.startswith('MemTotal:'))
    memory = round(kib / 2**20, 1)
  except (OSError, StopIteration):
    memory = None
  return {'cpu': cpu, 'cores': os.cpu_count(), 'memory_gib': memory}


def note_record_machine(measured_on: Mapping[str, Any]) -> None:
  """Notes the machine of a run record read back: the results file lists
  it under 'record_machines' when it is not this one."""
  if dict(measured_on) not in _RECORD_MACHINES:
    _RECORD_MACHINES.append(dict(measured_on))


def _load_average() -> Optional[float]:
  try:
    return os.getloadavg()[0]
  except OSError:
    return None


def _plain(value: Any) -> Any:
  """A JSON value for `value` (numpy scalars become Python numbers)."""
  if hasattr(value, 'item') and not isinstance(value, (str, bytes)):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def print_rows(columns: Sequence[Column],
               rows: Sequence[Mapping[str, Any]]) -> None:
  """Prints each row as `key=value` pairs, formatted as its column says."""
  for row in rows:
    print('  '.join(
        f'{c.key}=' + (format(row[c.key], c.format)
                       if row.get(c.key) is not None and c.format
                       else str(row.get(c.key))) for c in columns),
          flush=True)


class Results:
  """Collects a benchmark's tables; writes them with how they were made.

  Start it when the benchmark starts: it times the run and samples the
  machine's load average meanwhile (a timing measured beside other jobs is
  not comparable with one on an idle machine, and the file says so).
  """

  def __init__(self, benchmark: str, settings: Mapping[str, Any]):
    """Starts the clock and the load sampler.

    Args:
      benchmark: The benchmark's module name, e.g. 'ditto_fmnist'.
      settings: Its flags' values.
    """
    self._benchmark = benchmark
    self._settings = {k: _plain(v) for k, v in settings.items()}
    self._tables: dict[str, Any] = {}
    self._start = time.monotonic()
    self._loads: list[float] = []
    self._stop = threading.Event()
    self._sampler = threading.Thread(target=self._sample, daemon=True)
    self._sampler.start()

  def _sample(self) -> None:
    while True:
      load = _load_average()
      if load is not None:
        self._loads.append(load)
      if self._stop.wait(_LOAD_SAMPLE_SECONDS):
        return

  def table(self, name: str, title: str, columns: Sequence[Column],
            rows: Sequence[Mapping[str, Any]]) -> None:
    """Adds a table: `rows` hold each column's value under its key."""
    self._tables[name] = {
        'title': title,
        'columns': [dataclasses.asdict(c) for c in columns],
        'rows': [{c.key: _plain(row.get(c.key)) for c in columns}
                 for row in rows],
    }

  def as_dict(self) -> dict[str, Any]:
    """The results file's contents so far."""
    loads = list(self._loads)
    return {
        'benchmark': self._benchmark,
        'command': ' '.join(
            ['python -m', f'benchmarks.{self._benchmark}', *sys.argv[1:]]),
        'settings': self._settings,
        'machine': machine(),
        'record_machines': [m for m in _RECORD_MACHINES if m != machine()],
        'load_average': {
            'mean': round(sum(loads) / len(loads), 2) if loads else None,
            'max': round(max(loads), 2) if loads else None},
        'wall_seconds': round(time.monotonic() - self._start, 1),
        'tables': self._tables,
    }

  def save(self, path: str) -> None:
    """Writes the results so far to `path` (atomically); '' writes nothing.

    A long benchmark saves after every part, so the file always holds what
    has finished; `write` saves the last time.
    """
    if not path:
      return
    text = json.dumps(self.as_dict(), indent=2) + '\n'
    files.write_atomically(path, lambda f: f.write(text))

  def write(self, path: str) -> None:
    """Stops the load sampler and saves the results (see `save`)."""
    self._stop.set()
    self.save(path)
    if path:
      print(f'Results: {path}', flush=True)
