"""tff_fair installs with pip (pyproject.toml) and runs outside the checkout.

Both the documented routes are taken, offline: `pip install --no-deps .`
(into a target folder) and `pip install --no-deps -e .` (into a venv layered
on the project venv, whose packages it sees through a .pth file). The
package is built from a copy of the checkout's files, so nothing is written
into the checkout. `--no-build-isolation --no-index`: the build uses the
project venv's setuptools and wheel and never asks an index.
"""

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PIP_INSTALL = ('-m', 'pip', 'install', '--no-deps', '--no-build-isolation',
                '--no-index', '--no-cache-dir', '--disable-pip-version-check',
                '--quiet')

# Runs in a fresh interpreter whose working directory is outside the
# checkout; the package must come from `expected_dir`. A small piece of the
# README's loop: data, clients, the model on a client's batch (no TFF
# round: the readme test trains; this checks the installed package).
_SMALL_RUN = """
import os, sys
import tff_fair
assert tff_fair.__file__.startswith(expected_dir), tff_fair.__file__
assert not [p for p in sys.path if p and os.path.realpath(p) in (
    checkout, os.path.realpath(checkout))], sys.path

from tff_fair import data
from tff_fair.runtime import local  # Replaces TFF's context (clean exit).
from tff_fair.training import experiment

source = data.load_source('digits', max_examples=240)
clients = data.build_federated_data(
    source, partition='dirichlet', alpha=0.5, num_clients=3, seed=0)
train = clients.client_data('train', batch_size=16)
spec = experiment.model_spec_for(source)
batch = next(iter(train.create_tf_dataset_for_client(train.client_ids[0])))
print('logits', spec.build_keras(0)(batch['x']).shape)
"""


def _imported_modules(path: str) -> set[str]:
  """The tff_fair modules a source file imports (absolute imports only)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      # `from tff_fair.x import y`: y is a module or a name in x.
      names.add(node.module)
      names.update(f'{node.module}.{a.name}' for a in node.names)
  return {n for n in names if n == 'tff_fair' or n.startswith('tff_fair.')}


def _module_names(root: str) -> set[str]:
  """Dotted names of the modules and packages under root/tff_fair."""
  names = set()
  for directory, subdirectories, files in os.walk(
      os.path.join(root, 'tff_fair')):
    if '__pycache__' in subdirectories:
      subdirectories.remove('__pycache__')  # pip compiles what it installs.
    package = os.path.relpath(directory, root).replace(os.sep, '.')
    names.update(f'{package}.{f[:-3]}' for f in files if f.endswith('.py'))
    names.add(package)
  return {n.removesuffix('.__init__') for n in names}


def _copy_sources(destination: str) -> str:
  """Copies what `pip install .` reads (not BUILD files) to `destination`."""
  for name in ('pyproject.toml', 'README.md', 'LICENSE'):
    shutil.copy(os.path.join(_ROOT, name), destination)
  shutil.copytree(os.path.join(_ROOT, 'tff_fair'),
                  os.path.join(destination, 'tff_fair'),
                  ignore=shutil.ignore_patterns('BUILD', '__pycache__'))
  return destination


def _run_python(python: str, code: str, cwd: str,
                pythonpath: str = '') -> str:
  """Runs `code` with `python` in `cwd`, seeing only installed packages."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith('PYTHON')}  # Bazel's PYTHONPATH is the checkout.
  if pythonpath:
    env['PYTHONPATH'] = pythonpath
  result = subprocess.run([python, '-c', code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240,
                          check=False)
  if result.returncode:
    raise AssertionError(f'{code}\nfailed:\n{result.stderr[-4000:]}')
  return result.stdout


class PackagingTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.source_dir = _copy_sources(self.create_tempdir('src').full_path)
    self.elsewhere = self.create_tempdir('elsewhere').full_path

  def _pip(self, *args: str, python: str = sys.executable) -> None:
    result = subprocess.run([python, *_PIP_INSTALL, *args],
                            capture_output=True, text=True, timeout=240,
                            check=False)
    if result.returncode:
      raise AssertionError(f'pip install {args} failed:\n'
                           f'{result.stdout[-2000:]}{result.stderr[-4000:]}')

  def test_install_runs_outside_the_checkout(self):
    target = self.create_tempdir('site').full_path
    self._pip('--target', target, self.source_dir)
    # The package alone: every module of the sources, nothing else at the
    # top (programs/, tests/ stay in the checkout).
    installed = _module_names(target)
    self.assertEqual(installed, _module_names(self.source_dir))
    self.assertEqual(
        {n for n in os.listdir(target) if not n.endswith('.dist-info')},
        {'tff_fair'})
    # Whatever a module imports from tff_fair is installed (a file missing
    # from the copy would show here rather than only when imported).
    for directory, _, files in os.walk(os.path.join(target, 'tff_fair')):
      for name in files:
        if name.endswith('.py'):
          path = os.path.join(directory, name)
          missing = {
              m for m in _imported_modules(path)
              if m not in installed and m.rpartition('.')[0] not in installed
          }
          self.assertEmpty(missing, path)

    code = (f'expected_dir = {target!r}\ncheckout = {_ROOT!r}\n'
            + _SMALL_RUN)
    out = _run_python(sys.executable, code, self.elsewhere, pythonpath=target)
    self.assertIn('logits (', out)
    self.assertIn(', 10)', out)

  def test_editable_install_follows_the_sources(self):
    venv = self.create_tempdir('venv').full_path
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', venv],
                   check=True, timeout=60)
    python = os.path.join(venv, 'bin', 'python')
    # The new venv sees the project venv's packages (TFF, setuptools...).
    site = subprocess.run(
        [python, '-c', 'import sysconfig; print(sysconfig.get_paths()'
         '["purelib"])'], capture_output=True, text=True, check=True,
        timeout=60).stdout.strip()
    with open(os.path.join(site, 'project_venv.pth'), 'w') as f:
      f.write(sysconfig.get_paths()['purelib'] + '\n')
    # Its own `python -m pip` (pip comes through the .pth) installs into it.
    self._pip('--editable', self.source_dir, python=python)

    code = textwrap.dedent(f'''
        import tff_fair
        from tff_fair import data
        assert tff_fair.__file__.startswith({self.source_dir!r})
        print(data.load_source('digits', max_examples=50).num_examples)
        print(getattr(tff_fair, 'EDITED', 'not edited'))
    ''')
    self.assertEqual(_run_python(python, code, self.elsewhere).split(),
                     ['50', 'not', 'edited'])
    # Editable: a change to the sources shows without reinstalling.
    with open(os.path.join(self.source_dir, 'tff_fair', '__init__.py'),
              'a') as f:
      f.write('\nEDITED = "yes"\n')
    self.assertEqual(_run_python(python, code, self.elsewhere).split(),
                     ['50', 'yes'])


if __name__ == '__main__':
  absltest.main()
