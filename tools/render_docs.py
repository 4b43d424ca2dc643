r"""Renders the generated parts of README.md and docs/ from code and results.

A generated part of a Markdown file sits between two comment lines,

    <!-- generated:NAME -->
    ...
    <!-- generated:end -->

and NAME picks its renderer (`RENDERERS`): tables drawn from the recipes'
declarations or from committed results files, never typed by hand.

    python -m tools.render_docs           # rewrites every stale part
    python -m tools.render_docs --check   # lists them; exit status 1 if any

tests/docs_test.py runs the check, so a table that no longer matches its
source fails the test suite.
"""

import argparse
from collections.abc import Callable, Iterator
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PART = re.compile(
    r'(<!-- generated:(?P<name>[\w.:-]+) -->\n)(?P<body>.*?)'
    r'(<!-- generated:end -->)', re.DOTALL)


def settings_read_table() -> str:
  """Which algorithm-dependent shared settings each algorithm acts on."""
  # Imported here: the other renderers need no TensorFlow.
  from tff_fair.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from tff_fair.training.recipes import registry  # pylint: disable=g-import-not-at-top

  names = registry.names()
  cells = {}
  for name in names:
    recipe = registry.get(name)
    config = registry.make_config(algorithm=name, output_dir='unused')
    reads = recipe.settings_read(config)
    with_common = recipe.settings_read(registry.make_config(
        algorithm=name, output_dir='unused', common_test_evaluation=True))
    for setting in config_lib.ALGORITHM_DEPENDENT:
      if setting in reads:
        values = reads[setting]
        cell = 'yes' if values is None else ', '.join(map(str, values))
      elif setting in with_common:
        cell = 'with `--common_test_evaluation`'
      else:
        cell = 'no'
      cells[setting, name] = cell
  lines = ['| setting | ' + ' | '.join(f'`{n}`' for n in names) + ' |',
           '| --- |' + ' --- |' * len(names)]
  for setting in config_lib.ALGORITHM_DEPENDENT:
    lines.append(f'| `--{setting}` | ' + ' | '.join(
        cells[setting, n] for n in names) + ' |')
  return '\n'.join(lines) + '\n'


RENDERERS: dict[str, Callable[[], str]] = {
    'settings-read': settings_read_table,
}


def markdown_files(root: str = ROOT) -> list[str]:
  """README.md and every Markdown file under docs/."""
  return [os.path.join(root, 'README.md'), *sorted(glob.glob(
      os.path.join(root, 'docs', '**', '*.md'), recursive=True))]


def parts(text: str) -> Iterator[re.Match[str]]:
  """The generated parts of a Markdown text."""
  return _PART.finditer(text)


def render(text: str, path: str = '') -> str:
  """`text` with every generated part rendered anew.

  Raises:
    KeyError: For a part whose name has no renderer.
  """
  def body(match: re.Match[str]) -> str:
    name = match.group('name')
    if name not in RENDERERS:
      raise KeyError(f'{path}: no renderer for generated part {name!r};'
                     f' known: {", ".join(RENDERERS)}.')
    return match.group(1) + RENDERERS[name]() + match.group(4)

  return _PART.sub(body, text)


def stale_files(root: str = ROOT) -> list[str]:
  """The Markdown files whose generated parts differ from their rendering."""
  stale = []
  for path in markdown_files(root):
    with open(path) as f:
      text = f.read()
    if render(text, path) != text:
      stale.append(os.path.relpath(path, root))
  return stale


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--check', action='store_true',
                      help='list stale files; exit 1 if any')
  args = parser.parse_args(argv)
  if args.check:
    stale = stale_files()
    for path in stale:
      print(f'stale: {path} (run python -m tools.render_docs)')
    return 1 if stale else 0
  for path in markdown_files():
    with open(path) as f:
      text = f.read()
    rendered = render(text, path)
    if rendered != text:
      with open(path, 'w') as f:
        f.write(rendered)
      print(f'rendered: {os.path.relpath(path, ROOT)}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
