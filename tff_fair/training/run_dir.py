"""A run's output directory: checked before anything is written to it.

`inspect` reads the directory and decides what this invocation may do with
it, writing nothing:

* **new**: it does not exist, or holds nothing of tff_fair's;
* **unstarted**: it holds a `config.json` but no checkpoint and no results:
  a start that failed before its first checkpoint (e.g. killed while
  tracing). It is no run to resume, so its `config.json` is replaced by
  this invocation's, whatever the settings;
* **resume**: `config.json` and checkpoints; the settings must agree
  (`config.check_resumable`);
* refused (`RunDirError`): the path cannot hold a run (a file, under a file,
  read-only), `config.json` is damaged, checkpoints are gone beside other
  outputs, or the checkpoints are past `--rounds`. `start_over=True`
  discards a saved run (tff_fair's files only) instead of refusing the
  outputs that lack checkpoints or settings.

`Plan.apply` then makes the directory ready (the only writes before
training: removals asked for, leftovers of an interrupted checkpoint write,
`config.json`). `load_checkpoint` loads the newest checkpoint and reports a
damaged one with its path, falling back to the newest intact one only when
asked.

Plain Python: no TensorFlow, no TFF (the loader is passed in).
"""

from collections.abc import Callable, Sequence
import dataclasses
import os
import re
import shutil
from typing import Optional, TypeVar

from absl import logging

from tff_fair.state import client_store
from tff_fair.training import config as config_lib

CHECKPOINTS = 'checkpoints'
CHECKPOINT_PREFIX = 'program_state_'
# Files and folders of every run besides config.json and checkpoints/ (see
# tff_fair/training/driver.py); what start_over removes with them, and with
# the algorithms' own (`Layout`).
RESULT_FILES = ('metrics.csv', 'clients_final.csv', 'summary.json')
RESULT_DIRS = ('tensorboard',)

_CHECKPOINT = re.compile(rf'^{CHECKPOINT_PREFIX}(\d+)$')
# tff.program writes a checkpoint to <name>_temp<NNNN>, then renames it.
_CHECKPOINT_TEMP = re.compile(rf'^{CHECKPOINT_PREFIX}\d+_temp\d+$')

T = TypeVar('T')


@dataclasses.dataclass(frozen=True)
class Layout:
  """The algorithms' own outputs a run directory may hold.

  Attributes:
    files: Files of their own (tables).
    state_dirs: Folders of their per-client state stores
      (`tff_fair.state.client_store`, versioned with the checkpoints).
  """

  files: tuple[str, ...] = ()
  state_dirs: tuple[str, ...] = ()


class RunDirError(config_lib.ConfigError):
  """The output directory cannot hold, or does not hold, a usable run."""


@dataclasses.dataclass(frozen=True)
class Plan:
  """What this invocation does with its output directory.

  Attributes:
    config: The run's settings.
    kind: 'new', 'unstarted', 'resume' or 'start_over'.
    checkpoints: Checkpoint rounds on disk (before any removal), ascending.
    layout: The algorithms' own outputs (what start_over removes besides).
  """

  config: config_lib.RunConfig
  kind: str
  checkpoints: tuple[int, ...] = ()
  layout: Layout = Layout()

  def apply(self) -> None:
    """Prepares the directory; the first write of the invocation."""
    out = self.config.output_dir
    if self.kind == 'start_over':
      logging.info('--start_over: removing the saved run in %s.', out)
      remove_run(out, self.layout)
    elif self.kind == 'unstarted':
      logging.info('%s holds the config.json of a start that never reached'
                   ' its first checkpoint; replacing it.', out)
    remove_checkpoint_leftovers(out)
    config_lib.save_if_new(self.config,
                           replace=self.kind in ('unstarted', 'start_over'))


def checkpoint_dir(output_dir: str) -> str:
  return os.path.join(output_dir, CHECKPOINTS)


def checkpoint_path(output_dir: str, version: int) -> str:
  return os.path.join(checkpoint_dir(output_dir),
                      f'{CHECKPOINT_PREFIX}{version}')


def checkpoint_versions(output_dir: str) -> list[int]:
  """Rounds of the checkpoint folders in `output_dir`, ascending."""
  try:
    names = os.listdir(checkpoint_dir(output_dir))
  except (FileNotFoundError, NotADirectoryError):
    return []
  return sorted(int(m.group(1)) for m in map(_CHECKPOINT.match, names) if m)


def check_output_path(output_dir: str, layout: Layout = Layout()) -> None:
  """Refuses a path that cannot hold a run directory; writes nothing.

  Raises:
    RunDirError: If the path is a file or lies under one, or the directory
      (or the one it would be created in) is not writable.
  """
  path = os.path.abspath(output_dir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise RunDirError(
        f'--output_dir {output_dir} is a file, not a directory; choose'
        ' another --output_dir.')
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise RunDirError(
        f'--output_dir {output_dir} cannot be created: {existing} is a file.'
        ' Choose another --output_dir.')
  try:
    read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
  except OSError:
    read_only = False
  if read_only:
    raise RunDirError(
        f'--output_dir {output_dir}: {existing} is on a read-only file'
        ' system; choose an --output_dir on a writable one.')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise RunDirError(
        f'--output_dir {output_dir}: no permission to write in {existing};'
        ' choose another --output_dir or fix its permissions.')
  for name in (CHECKPOINTS, *layout.state_dirs):
    sub = os.path.join(path, name)
    if os.path.exists(sub) and not os.path.isdir(sub):
      raise RunDirError(
          f'{sub} is a file, but tff_fair keeps a folder there; move it away'
          ' or choose another --output_dir.')


def _results(output_dir: str, layout: Layout) -> list[str]:
  """The run's outputs other than config.json, checkpoints and TensorBoard."""
  found = [name for name in (*RESULT_FILES, *layout.files)
           if os.path.exists(os.path.join(output_dir, name))]
  for name in layout.state_dirs:
    if client_store.committed_versions(os.path.join(output_dir, name)):
      found.append(f'{name}/')
  return found


def inspect(config: config_lib.RunConfig, start_over: bool = False,
            layout: Layout = Layout(),
            reads: Optional[config_lib.Reads] = None) -> Plan:
  """Decides what this invocation does with `config.output_dir`; reads only.

  Args:
    config: The run's settings.
    start_over: Discard a saved run in the directory instead of resuming it
      or refusing it.
    layout: The algorithms' own outputs the directory may hold.
    reads: What the algorithm reads (`Recipe.settings_read`): a resume
      compares only those of the algorithm-dependent settings.

  Returns:
    The `Plan`.

  Raises:
    RunDirError: (or `config.ConfigError`) If the directory cannot be used
      as asked; the message says how to fix it.
  """
  out = config.output_dir
  check_output_path(out, layout)
  versions = tuple(checkpoint_versions(out))
  has_config = os.path.exists(os.path.join(out, config_lib.CONFIG_FILE))
  results = _results(out, layout)
  if start_over:
    if has_config or versions or results:
      return Plan(config, 'start_over', versions, layout)
    return Plan(config, 'new', layout=layout)
  if not has_config:
    if versions or results:
      raise RunDirError(
          f'{out} holds {_describe(versions, results)} but no'
          f' {config_lib.CONFIG_FILE}, so its settings are unknown. Pass'
          ' --start_over to discard that run, or choose another'
          ' --output_dir.')
    return Plan(config, 'new', layout=layout)
  if not versions:
    if results:
      raise RunDirError(
          f'{out} holds a run ({", ".join(results)}) whose checkpoints are'
          f' missing ({checkpoint_dir(out)} has none), so it cannot be'
          ' resumed. Restore the checkpoints, pass --start_over to train'
          ' from round 0 (its outputs are discarded), or choose another'
          ' --output_dir.')
    config_lib.load_saved(out)  # Refuses a damaged file even so.
    return Plan(config, 'unstarted', layout=layout)
  config_lib.check_resumable(config, reads)
  if versions[-1] > config.rounds:
    raise RunDirError(
        f'{out} holds a checkpoint of round {versions[-1]}, past'
        f' rounds={config.rounds}; ask for at least --rounds={versions[-1]},'
        ' or use a new --output_dir.')
  return Plan(config, 'resume', versions, layout)


def _describe(versions: Sequence[int], results: Sequence[str]) -> str:
  parts = list(results)
  if versions:
    parts.insert(0, f'checkpoints up to round {versions[-1]}')
  return ', '.join(parts)


def remove_run(output_dir: str, layout: Layout = Layout()) -> None:
  """Removes tff_fair's files of a run (other files are kept)."""
  for name in (config_lib.CONFIG_FILE, *RESULT_FILES, *layout.files):
    path = os.path.join(output_dir, name)
    if os.path.exists(path):
      os.remove(path)
  for name in (CHECKPOINTS, *RESULT_DIRS, *layout.state_dirs):
    shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)


def remove_checkpoint_leftovers(output_dir: str) -> None:
  """Removes half-written checkpoints (tff.program's `*_temp*` folders)."""
  directory = checkpoint_dir(output_dir)
  if not os.path.isdir(directory):
    return
  for name in os.listdir(directory):
    if _CHECKPOINT_TEMP.match(name):
      logging.info('Removing %s, a checkpoint whose writing was interrupted.',
                   os.path.join(directory, name))
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _one_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return f'{type(error).__name__}: {text[0] if text else ""}'[:300]


def load_checkpoint(
    output_dir: str,
    versions: Sequence[int],
    load: Callable[[int], T],
    *,
    fallback: bool = False,
    usable: Optional[Callable[[int], Optional[str]]] = None,
) -> tuple[Optional[T], int]:
  """Loads the newest checkpoint; a damaged one is reported with its path.

  Args:
    output_dir: The run's directory.
    versions: Checkpoint rounds on disk, ascending.
    load: `round -> state`; any exception it raises marks that checkpoint
      damaged.
    fallback: Resume from the newest intact checkpoint when the latest is
      damaged; the damaged ones are renamed `<name>_damaged` (kept for
      inspection, ignored by tff.program).
    usable: `round -> None`, or why the run cannot resume from that round
      (e.g. its per-client state was not kept). Asked of the rounds a
      fallback reaches; an unusable one ends the search, as the rounds
      before it cannot be resumed either (training again would reach its
      checkpoint, which tff.program does not overwrite).

  Returns:
    (state, round), or (None, 0) when there is no checkpoint.

  Raises:
    RunDirError: If the latest checkpoint is damaged and `fallback` is off,
      or no checkpoint before it is intact and usable.
  """
  if not versions:
    return None, 0
  damaged = []
  skipped = []
  for version in reversed(versions):
    path = checkpoint_path(output_dir, version)
    if damaged and usable is not None:
      reason = usable(version)
      if reason:
        skipped.append(f'round {version} ({reason})')
        break
    try:
      state = load(version)
    except Exception as e:  # pylint: disable=broad-except
      damaged.append((version, path, _one_line(e)))
      if not fallback:
        raise RunDirError(
            f'The latest checkpoint {path} (round {version}) is damaged'
            f' ({_one_line(e)}). Re-run with --checkpoint_fallback to resume'
            ' from the newest intact checkpoint, or --start_over to train'
            ' from round 0.') from e
      continue
    if damaged:
      for _, bad, why in damaged:
        target, n = f'{bad}_damaged', 1
        while os.path.exists(target):  # Damaged before, in an earlier run.
          target, n = f'{bad}_damaged{n}', n + 1
        logging.warning('Checkpoint %s is damaged (%s); renamed to %s.', bad,
                        why, target)
        os.rename(bad, target)
      logging.warning('--checkpoint_fallback: resuming from round %d.',
                      version)
    return state, version
  raise RunDirError(
      f'No checkpoint in {checkpoint_dir(output_dir)} can be resumed:'
      f' damaged: {", ".join(f"{p} ({w})" for _, p, w in damaged)}'
      + (f'; not usable: {", ".join(skipped)}' if skipped else '') +
      '. Pass --start_over to train from round 0, or choose another'
      ' --output_dir.')

