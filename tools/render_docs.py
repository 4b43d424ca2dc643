r"""Renders the generated parts of README.md and docs/ from code and results.

A generated part of a Markdown file sits between two comment lines,

    <!-- generated:NAME -->
    ...
    <!-- generated:end -->

and NAME picks its renderer (`RENDERERS`): tables drawn from the recipes'
declarations or from committed results files, never typed by hand. A NAME
`KIND:ARGUMENT` calls the renderer of KIND with ARGUMENT, e.g.
`benchmark:ditto_fmnist` renders benchmarks/results/ditto_fmnist.json (how
it was made, then every table) and `benchmark:ditto_fmnist:a1` one table.

    python -m tools.render_docs           # rewrites every stale part
    python -m tools.render_docs --check   # lists them; exit status 1 if any

tests/docs_test.py runs the check, so a table that no longer matches its
source fails the test suite.
"""

import argparse
from collections.abc import Callable, Iterator, Sequence
import dataclasses
import glob
import json
import os
import re
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Committed benchmark results (schema: benchmarks/report.py).
RESULTS_DIR = os.path.join(ROOT, 'benchmarks', 'results')
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
    required = recipe.required_settings
    config = registry.make_config(algorithm=name, output_dir='unused',
                                  **required)
    reads = recipe.settings_read(config)
    with_common = recipe.settings_read(registry.make_config(
        algorithm=name, output_dir='unused', common_test_evaluation=True,
        **required))
    for setting in config_lib.ALGORITHM_DEPENDENT:
      if setting in required:
        cell = 'required'
      elif setting in reads:
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


def _escape(text: str) -> str:
  """`text` for a Markdown table cell."""
  return ' '.join(text.split()).replace('|', '\\|')


def _default(value: Any) -> str:
  if value is None or value == '':
    return '(none)'
  if isinstance(value, bool):
    return f'`{str(value).lower()}`'
  return f'`{value}`'


def flags_table(topic: str) -> str:
  """The program's flags of one `--helpfull` group: name, default, help."""
  # Imported here: defining the program's flags imports TensorFlow.
  from programs import train  # pylint: disable=g-import-not-at-top

  if topic not in train.FLAG_GROUPS:
    raise KeyError(f'No flag group {topic!r}; known:'
                   f' {", ".join(train.FLAG_GROUPS)}.')
  group = train.FLAGS.flags_by_module_dict()[train.FLAG_GROUPS[topic]]
  lines = ['| flag | default | what it sets |', '| --- | --- | --- |']
  for flag in sorted(group, key=lambda f: f.name):
    # As --helpfull shows it (an enum's help starts with its choices).
    lines.append(f'| `--{flag.name}` | {_default(flag.default)} |'
                 f' {_escape(flag.help)} |')
  return '\n'.join(lines) + '\n'


def algorithm_settings_table(name: str) -> str:
  """An algorithm's own settings (its recipe's `Settings`): its flags."""
  from tff_fair.training.recipes import registry  # pylint: disable=g-import-not-at-top

  registry.get(name)  # Refuses an unknown name.
  rows = [(field, owners) for field, owners in registry.setting_fields()
          if name in owners]
  if not rows:
    return f'`--algorithm={name}` has no settings of its own.\n'
  lines = ['| flag | default | what it sets |', '| --- | --- | --- |']
  for field, owners in rows:
    choices = field.metadata['choices']
    text = (f'One of {", ".join(f"`{c}`" for c in choices)}: '
            if choices else '') + field.metadata['help']
    if len(owners) > 1:
      text += f' (Also read by {", ".join(o for o in owners if o != name)}.)'
    lines.append(f'| `--{field.name}` | {_default(field.default)} |'
                 f' {_escape(text)} |')
  return '\n'.join(lines) + '\n'


def load_results(name: str) -> dict[str, Any]:
  """The committed results of benchmark `name`.

  Raises:
    KeyError: When benchmarks/results/<name>.json does not exist.
  """
  path = os.path.join(RESULTS_DIR, f'{name}.json')
  if not os.path.exists(path):
    raise KeyError(f'No results file {os.path.relpath(path, ROOT)}: run the'
                   ' benchmark with --results_file.')
  with open(path) as f:
    return json.load(f)


def results_names() -> list[str]:
  """The benchmarks whose results are committed."""
  return sorted(os.path.basename(p)[:-len('.json')]
                for p in glob.glob(os.path.join(RESULTS_DIR, '*.json')))


def _cell(value: Any, spec: str) -> str:
  if value is None:
    return '-'
  return _escape(format(value, spec))


def results_table(table: dict[str, Any]) -> str:
  """One table of a results file as Markdown."""
  columns = table['columns']
  lines = ['| ' + ' | '.join(c['title'] for c in columns) + ' |',
           '|' + ''.join(' ---: |' if c['format'] else ' --- |'
                         for c in columns)]
  for row in table['rows']:
    lines.append('| ' + ' | '.join(
        _cell(row[c['key']], c['format']) for c in columns) + ' |')
  return '\n'.join(lines) + '\n'


def _minutes(seconds: float) -> str:
  return (f'{seconds / 60:.1f} min' if seconds >= 60 else f'{seconds:.0f} s')


def benchmark_part(argument: str) -> str:
  """`NAME`: how benchmark NAME's results were made, then its tables;
  `NAME:TABLE`: that table alone."""
  name, _, table = argument.partition(':')
  results = load_results(name)
  if table:
    if table not in results['tables']:
      raise KeyError(f'{name}.json has no table {table!r}; it has'
                     f' {", ".join(results["tables"])}.')
    return results_table(results['tables'][table])
  machine, load = results['machine'], results['load_average']
  lines = ['<!-- test: command -->', '```sh',
           _wrapped(results['command'].replace('python -m',
                                               '.venv/bin/python -m', 1)),
           '```', '',
           f'It ran for {_minutes(results["wall_seconds"])} on'
           f' {machine["cores"]} cores, load average {load["mean"]} (mean)'
           f' and {load["max"]} (max); results file'
           f' `benchmarks/results/{name}.json`.{_record_machines(results)}',
           '']
  for table in results['tables'].values():
    lines += [f'{table["title"]}:', '', results_table(table)]
  return '\n'.join(lines)


def _record_machines(results: dict[str, Any]) -> str:
  """What the results say of figures read from run records measured on
  other machines ('' when none)."""
  others = results.get('record_machines', [])
  if not others:
    return ''
  # Memory too: two machines may differ only in it.
  named = '; '.join(f'{m["cpu"]}, {m["cores"]} cores, {m["memory_gib"]} GiB'
                    for m in others)
  return (' Of the run records it read back (benchmarks/run_records.py),'
          f' some were measured elsewhere: {named}.')


def _wrapped(command: str, width: int = 76) -> str:
  """A shell command broken with backslashes before `width` columns."""
  lines, line = [], ''
  for word in command.split():
    if line and len(line) + 1 + len(word) > width - 2:
      lines.append(line + ' \\')
      line = '    ' + word
    else:
      line = f'{line} {word}' if line else word
  return '\n'.join(lines + [line])


def machines_table() -> str:
  """The machines the committed results were measured on."""
  machines: dict[tuple[Any, ...], list[str]] = {}
  for name in results_names():
    results = load_results(name)
    for machine in [results['machine'], *results.get('record_machines', [])]:
      key = (machine['cpu'], machine['cores'], machine['memory_gib'])
      machines.setdefault(key, []).append(f'`{name}`')
  lines = ['| CPU (/proc/cpuinfo) | cores | memory (GiB) | benchmarks |',
           '| --- | ---: | ---: | --- |']
  for (cpu, cores, memory), names in machines.items():
    lines.append(f'| {cpu} | {cores} | {memory} | {", ".join(names)} |')
  return '\n'.join(lines) + '\n'


def _no_argument(render_fn: Callable[[], str]) -> Callable[[str], str]:
  def render_part(argument: str) -> str:
    if argument:
      raise KeyError(f'{render_fn.__name__} takes no argument ({argument!r}).')
    return render_fn()
  return render_part


# Part KIND -> its renderer, called with the ARGUMENT of `KIND:ARGUMENT`.
RENDERERS: dict[str, Callable[[str], str]] = {
    'settings-read': _no_argument(settings_read_table),
    'benchmark': benchmark_part,
    'benchmark-machines': _no_argument(machines_table),
    'flags': flags_table,
    'algorithm-settings': algorithm_settings_table,
}


# A fenced code block and the comment line right above it, if any.
_BLOCK = re.compile(
    r'(?:^<!-- (?P<marker>[^\n]*?) -->\n)?^```(?P<lang>[^\n`]*)\n'
    r'(?P<code>.*?)^```[ \t]*$', re.MULTILINE | re.DOTALL)
# Languages whose blocks are commands or code: each needs a marker.
RUNNABLE_LANGUAGES = ('sh', 'bash', 'shell', 'console', 'python')


@dataclasses.dataclass(frozen=True)
class CodeBlock:
  """A fenced code block of a Markdown file.

  Attributes:
    path: The file, relative to the repository root.
    line: The line of its opening fence (1-based).
    lang: Its language ('' when the fence names none).
    code: Its text.
    marker: The comment right above the fence, e.g. 'test: command',
      'test: python ditto' or 'not run: <reason>' ('' when none).
  """
  path: str
  line: int
  lang: str
  code: str
  marker: str


def code_blocks(paths: Sequence[str] = ()) -> list[CodeBlock]:
  """The fenced code blocks of `paths` (default: README.md and docs/)."""
  blocks = []
  for path in paths or markdown_files():
    with open(path) as f:
      text = f.read()
    for match in _BLOCK.finditer(text):
      fence = match.start('lang') - 3
      blocks.append(CodeBlock(
          path=os.path.relpath(path, ROOT),
          line=text.count('\n', 0, fence) + 1,
          lang=match.group('lang').strip(), code=match.group('code'),
          marker=match.group('marker') or ''))
  return blocks


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
    kind, _, argument = match.group('name').partition(':')
    if kind not in RENDERERS:
      raise KeyError(f'{path}: no renderer for generated part {kind!r};'
                     f' known: {", ".join(RENDERERS)}.')
    return match.group(1) + RENDERERS[kind](argument) + match.group(4)

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
