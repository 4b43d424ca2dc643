"""Disk-backed, versioned per-client state (e.g. Ditto's personal models).

Per-client state lives outside TFF: a `LearningProcess` cannot return
client-placed values, and 10,000 clients of a 1M-parameter model (40 GB of
float32) must not sit in memory. Only the clients of the current round are
ever read or written.

Layout under `root`:

    clients/<client key>/v<round>.npz   one file per client and version
    manifests/v<round>.json             which version of each client is
                                         current after that round, with the
                                         SHA-256 of its file

Consistency with the server checkpoint (the field notes' "two writes" trap):
a round's client files are written first (each atomically: temporary file,
fsync, rename), then the round's manifest (atomically). The training driver
saves its checkpoint of round r after `commit(r)` and calls `prune(r)` only
after that checkpoint is on disk, naming the rounds whose checkpoints are
kept: their manifests and files stay, so a resume that falls back to an
older checkpoint finds that round's state. On resume from the checkpoint of
round r the store opens manifest r: files and manifests of later rounds (a run killed
after `commit` but before its checkpoint) are ignored and overwritten when
those rounds run again, so a resumed run reads exactly the state an
uninterrupted run would have.

Damage is never repaired silently: a listed file that is missing, unreadable,
of the wrong shapes or whose hash differs from the manifest raises
`ClientStateError` naming the file. A client absent from the manifest is new.

This module is plain numpy: it knows nothing of TensorFlow or TFF.
"""

from collections.abc import Iterable, Mapping, Sequence
import dataclasses
import hashlib
import io
import json
import os
import re
from typing import Any, Optional

import numpy as np

from tff_fair import errors
from tff_fair import files

_MANIFEST_PATTERN = re.compile(r'^v(\d+)\.json$')
_VERSION_PATTERN = re.compile(r'^v(\d+)\.npz$')


class ClientStateError(errors.UserError, RuntimeError):
  """A stored client state is missing, damaged or of the wrong kind."""


def committed_versions(root: str) -> list[int]:
  """The versions (rounds) with a manifest under `root`, ascending.

  Reads the folder only; an absent store has none.
  """
  try:
    names = os.listdir(os.path.join(root, 'manifests'))
  except (FileNotFoundError, NotADirectoryError):
    return []
  return sorted(int(m.group(1)) for m in map(_MANIFEST_PATTERN.match, names)
                if m)


@dataclasses.dataclass(frozen=True)
class _Entry:
  version: int
  sha256: str
  metadata: Mapping[str, Any]


def _client_key(client_id: str) -> str:
  """A file-system-safe directory name that maps back to one client id."""
  safe = re.sub(r'[^A-Za-z0-9_.-]', '_', client_id)[:80]
  digest = hashlib.sha256(client_id.encode('utf-8')).hexdigest()[:12]
  return f'{safe}-{digest}'


class ClientStateStore:
  """Versioned arrays per client, consistent with round checkpoints.

  Typical round r of a driver:

      store = ClientStateStore(root, template)   # once
      store.open(r - 1)                          # the checkpoint's version
      arrays = store.read(client_id)             # None for a new client
      store.write(client_id, new_arrays, r)      # for each updated client
      store.commit(r)                            # the round's manifest
      ... save the server checkpoint of round r ...
      store.prune(r, updated, keep=kept_rounds)  # drop what no kept
                                                 # checkpoint needs
  """

  def __init__(self, root: str, template: Sequence[np.ndarray]):
    """Creates or opens a store.

    Args:
      root: Directory of the store (created if missing).
      template: Arrays with the shapes and dtypes every client state has;
        reads are checked against them.
    """
    self._root = root
    self._shapes = [(tuple(np.shape(a)), np.asarray(a).dtype.str)
                    for a in template]
    self._entries: dict[str, _Entry] = {}
    self._pending: dict[str, _Entry] = {}
    self._version = 0
    os.makedirs(os.path.join(root, 'manifests'), exist_ok=True)
    os.makedirs(os.path.join(root, 'clients'), exist_ok=True)

  @property
  def version(self) -> int:
    """The round whose manifest is open."""
    return self._version

  def _file(self, client_id: str, version: int) -> str:
    return os.path.join(self._root, 'clients', _client_key(client_id),
                        f'v{version}.npz')

  def _manifest(self, version: int) -> str:
    return os.path.join(self._root, 'manifests', f'v{version}.json')

  def open(self, version: int) -> None:
    """Makes manifest `version` current (0: the empty store).

    Raises:
      ClientStateError: If the manifest is missing or damaged.
    """
    self._pending = {}
    self._version = version
    self._entries = self._read_manifest(version) if version else {}

  def _read_manifest(self, version: int) -> dict[str, _Entry]:
    """Client id -> entry of manifest `version`.

    Raises:
      ClientStateError: If the manifest is missing or damaged.
    """
    path = self._manifest(version)
    try:
      with open(path) as f:
        manifest = json.load(f)
      return {
          cid: _Entry(e['version'], e['sha256'], e.get('metadata', {}))
          for cid, e in manifest['clients'].items()
      }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise ClientStateError(
          f'Client-state manifest {path} for round {version} is missing or'
          f' damaged ({e}). The checkpoint of round {version} needs it;'
          ' restore the file or start the run in a new output directory.'
      ) from e

  def client_ids(self) -> list[str]:
    """Clients with a stored state in the open version."""
    return sorted(self._entries)

  def metadata(self, client_id: str) -> Optional[Mapping[str, Any]]:
    """The metadata stored with a client's state, or None if new."""
    entry = self._entries.get(client_id)
    return None if entry is None else entry.metadata

  def read(self, client_id: str) -> Optional[list[np.ndarray]]:
    """A client's arrays in the open version, or None for a new client.

    Raises:
      ClientStateError: If the listed file is missing or damaged.
    """
    entry = self._entries.get(client_id)
    if entry is None:
      return None
    path = self._file(client_id, entry.version)
    try:
      with open(path, 'rb') as f:
        data = f.read()
    except OSError as e:
      raise ClientStateError(
          f'State of client {client_id!r} (round {entry.version}) is'
          f' missing: {path} ({e}). It is never re-created silently: restore'
          ' it, or start the run in a new output directory.') from e
    if hashlib.sha256(data).hexdigest() != entry.sha256:
      raise ClientStateError(
          f'State of client {client_id!r} in {path} is damaged (its SHA-256'
          ' differs from the manifest). Restore the file, or start the run in'
          ' a new output directory.')
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
      arrays = [npz[f'a{i}'] for i in range(len(npz.files))]
    shapes = [(a.shape, a.dtype.str) for a in arrays]
    if shapes != self._shapes:
      raise ClientStateError(
          f'State of client {client_id!r} in {path} has shapes {shapes}, the'
          f' model needs {self._shapes}: the store belongs to another model.')
    return arrays

  def write(
      self, client_id: str, arrays: Sequence[np.ndarray], version: int,
      metadata: Optional[Mapping[str, Any]] = None,
  ) -> None:
    """Stores a client's arrays as of round `version` (pending commit)."""
    if version <= self._version:
      raise ValueError(
          f'Cannot write round {version} on top of round {self._version}.')
    arrays = [np.asarray(a) for a in arrays]
    shapes = [(a.shape, a.dtype.str) for a in arrays]
    if shapes != self._shapes:
      raise ValueError(
          f'Client {client_id!r}: shapes {shapes} differ from the store\'s'
          f' {self._shapes}.')
    buffer = io.BytesIO()
    np.savez(buffer, **{f'a{i}': a for i, a in enumerate(arrays)})
    data = buffer.getvalue()
    files.write_atomically(self._file(client_id, version),
                           lambda f: f.write(data), binary=True)
    self._pending[client_id] = _Entry(
        version, hashlib.sha256(data).hexdigest(), dict(metadata or {}))

  def commit(self, version: int) -> None:
    """Writes manifest `version` (open entries plus pending writes)."""
    entries = {**self._entries, **self._pending}
    manifest = {
        'version': version,
        'clients': {
            cid: {'version': e.version, 'sha256': e.sha256,
                  'metadata': dict(e.metadata)}
            for cid, e in sorted(entries.items())
        },
    }
    files.write_atomically(self._manifest(version),
                           lambda f: json.dump(manifest, f))
    self._entries, self._pending, self._version = entries, {}, version

  def prune(self, version: int, updated: Iterable[str] = (),
            keep: Iterable[int] = ()) -> None:
    """Deletes what the manifests still needed no longer reference.

    Call only after the checkpoint of round `version` is saved. Manifest
    `version` and the older ones in `keep` (the rounds whose server
    checkpoints are kept, so a run can fall back to them) stay; older
    manifests go, with the files only they referenced. Of the clients in
    `updated` (those written in round `version`) every file no kept
    manifest references goes too. Other clients' files are touched only
    when a manifest that referenced them goes, so a round costs work for
    its own clients and the manifests it drops.

    Args:
      version: The round just checkpointed (its manifest is open).
      updated: Clients written in that round.
      keep: Earlier rounds whose manifests (and files) must stay.
    """
    kept = sorted({v for v in keep if 0 < v < version})
    dropped = [old for old in committed_versions(self._root)
               if old < version and old not in kept]
    candidates: dict[str, set[int]] = {}
    for old in dropped:
      try:
        entries = self._read_manifest(old)
      except ClientStateError:
        entries = {}  # Unreadable: its files are left alone.
      for cid, entry in entries.items():
        candidates.setdefault(cid, set()).add(entry.version)
    try:
      manifests = [self._entries] + [self._read_manifest(v) for v in kept]
    except ClientStateError:
      return  # What a damaged kept manifest needs is unknown: delete nothing.
    referenced: dict[str, set[int]] = {}
    for manifest in manifests:
      for cid, entry in manifest.items():
        referenced.setdefault(cid, set()).add(entry.version)
    # Manifests first: a kill midway leaves no manifest missing a file.
    for old in dropped:
      os.remove(self._manifest(old))
    for client_id in updated:
      directory = os.path.dirname(self._file(client_id, version))
      for name in os.listdir(directory):
        match = _VERSION_PATTERN.match(name)
        if match:
          candidates.setdefault(client_id, set()).add(int(match.group(1)))
    for client_id, versions in candidates.items():
      for stale in versions - referenced.get(client_id, set()):
        path = self._file(client_id, stale)
        if os.path.exists(path):
          os.remove(path)
