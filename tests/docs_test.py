"""The docs hold what is true now.

README.md and docs/: generated parts match their sources; every relative
link (and its #anchor) resolves; every command or code block is run, checked
or marked as not run with a reason; commands parse as the program's flags
and its checks of a configuration (nothing is trained here: the Python
examples run in tests/readme_test.py); the README's algorithm table names
the registry's algorithms; nothing names a commit or a past run's date.
"""

import os
import re
import shlex
import sys

from absl import flags
from absl.testing import absltest

from programs import train
from tools import render_docs
from tff_fair.training.recipes import registry

# [text](target) with a relative target (maybe '#anchor' alone).
_LINK = re.compile(r'\[[^\]]*\]\((?!https?://|mailto:)([^)\s]*)\)')
_HEADING = re.compile(r'^#{1,6} (.+?)\s*$', re.MULTILINE)
# Leading VAR=value words of a shell command.
_ASSIGNMENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*=')
# Flag names a program defines, read off its source.
_DEFINED = re.compile(
    r"DEFINE_\w+\(\s*'(\w+)'|add_argument\(\s*'--(\w+)'")
_ABSL_FLAGS = ('help', 'helpfull', 'helpshort', 'helpxml', 'flagfile',
               'undefok', 'logtostderr', 'alsologtostderr', 'verbosity', 'v')
_ROOT = render_docs.ROOT


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading."""
  text = re.sub(r'[`*_\[\]()]', '', heading).strip().lower()
  return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


def _anchors(path: str) -> set[str]:
  with open(path) as f:
    return {_slug(h) for h in _HEADING.findall(
        re.sub(r'^```.*?^```', '', f.read(), flags=re.M | re.S))}


def _commands(code: str) -> list[list[str]]:
  """The shell commands of a block: words, without comments or VAR=."""
  commands = []
  for line in code.replace('\\\n', ' ').splitlines():
    words = shlex.split(line, comments=True)
    while words and _ASSIGNMENT.match(words[0]):
      words.pop(0)
    if words:
      commands.append(words)
  return commands


def _flag_names(args: list[str]) -> list[str]:
  return [a[2:].split('=')[0] for a in args if a.startswith('--')]


def _makefile_variable(name: str) -> str:
  """A variable's default in the Makefile (`NAME ?= ...`, continued)."""
  with open(os.path.join(_ROOT, 'Makefile')) as f:
    text = f.read().replace('\\\n', ' ')
  match = re.search(rf'^{name} \?=(.*)$', text, re.MULTILINE)
  return match.group(1).strip() if match else ''



def _defined_flags(source: str) -> set[str]:
  """The flags `source` defines, with those of the benchmarks modules it
  imports (e.g. `run_files`' --finished_only)."""
  with open(source) as f:
    text = f.read()
  defined = {a or b for a, b in _DEFINED.findall(text)}
  for name in re.findall(r'^from benchmarks import (\w+)$', text, re.M):
    with open(os.path.join(_ROOT, 'benchmarks', f'{name}.py')) as f:
      defined |= {a or b for a, b in _DEFINED.findall(f.read())}
  return defined

class DocsTest(absltest.TestCase):

  def test_generated_parts_match_their_sources(self):
    self.assertEqual(render_docs.stale_files(), [],
                     'run: python -m tools.render_docs')

  def test_every_relative_link_resolves(self):
    for path in render_docs.markdown_files():
      with open(path) as f:
        text = f.read()
      for link in _LINK.findall(text):
        target, _, anchor = link.partition('#')
        resolved = (os.path.normpath(os.path.join(os.path.dirname(path),
                                                  target))
                    if target else path)
        with self.subTest(file=os.path.relpath(path, _ROOT), link=link):
          self.assertTrue(os.path.exists(resolved))
          if anchor and resolved.endswith('.md'):
            self.assertIn(anchor, _anchors(resolved))

  def test_every_code_block_is_marked(self):
    for block in render_docs.code_blocks():
      with self.subTest(file=block.path, line=block.line):
        self.assertTrue(block.lang, 'name the block\'s language (```text'
                        ' for output and signatures)')
        if block.lang not in render_docs.RUNNABLE_LANGUAGES:
          continue
        kind = (f'test: {"python" if block.lang == "python" else "command"}')
        self.assertTrue(
            block.marker.startswith(kind) or (
                block.marker.startswith('not run:')
                and len(block.marker) > len('not run: ')),
            f'put "<!-- {kind} ... -->" or "<!-- not run: <reason> -->" on'
            ' the line above the block')

  def test_commands_parse_and_their_configurations_are_valid(self):
    blocks = [b for b in render_docs.code_blocks()
              if b.marker == 'test: command']
    self.assertNotEmpty(blocks)
    for block in blocks:
      for words in _commands(block.code):
        with self.subTest(file=block.path, line=block.line,
                          command=' '.join(words[:4])):
          self._check_command(words)

  def _check_command(self, words: list[str]) -> None:
    program, args = words[0], words[1:]
    if program == 'make':
      variables = dict(a.split('=', 1) for a in args if '=' in a)
      targets = [a for a in args if '=' not in a]
      with open(os.path.join(_ROOT, 'Makefile')) as f:
        rules = set(re.findall(r'^([\w-]+):', f.read(), re.MULTILINE))
      self.assertContainsSubset(targets, rules)
      if 'demo' in targets:  # The program with the demo's flags.
        self._check_train(
            shlex.split(variables.get('DEMO_FLAGS',
                                      _makefile_variable('DEMO_FLAGS')))
            + [f'--output_dir={variables.get("OUTPUT_DIR", "runs/demo")}']
            + shlex.split(variables.get('FLAGS', '')))
    elif program == 'bazel':
      self.assertEqual(args[:2], ['run', '//programs:train'])
      self.assertEqual(args[2], '--')
      self._check_train(args[3:])
    elif os.path.basename(program).startswith('python'):
      if args[0] == '-m':
        module, args = args[1], args[2:]
        source = os.path.join(_ROOT, *module.split('.')) + '.py'
      else:
        source, args = os.path.join(_ROOT, args[0]), args[1:]
        module = ''
      self.assertTrue(os.path.exists(source), source)
      if module == 'programs.train':
        self._check_train(args)
      else:
        defined = _defined_flags(source)
        for name in _flag_names(args):
          self.assertTrue(
              name in defined or name in _ABSL_FLAGS
              or name.removeprefix('no') in defined,
              f'{source} defines no --{name}')
    else:
      self.fail(f'{program}: not a command this test knows; mark the block'
                ' "<!-- not run: <reason> -->"')

  def _check_train(self, args: list[str]) -> None:
    """Parses programs.train's flags and checks the run's configuration."""
    names = _flag_names(args)
    if {'help', 'helpfull', 'helpshort'} & set(names):
      self.assertEqual(len(names), 1, 'a help flag alone')
      return
    self.assertIn('output_dir', names)  # The program requires it.
    train.FLAGS.unparse_flags()
    try:
      rest = train.FLAGS(['train', *args])
      self.assertEqual(rest, ['train'], 'no positional arguments')
      config = train.config_from_flags()
      if train.FLAGS.executor == 'remote':
        registry.check_workers(config.algorithm,
                               len(train.FLAGS.workers.split(',')))
    except flags.Error as e:
      self.fail(f'bad flags: {e}')
    finally:  # Parsed again, as absltest left them.
      train.FLAGS.unparse_flags()
      train.FLAGS(['docs_test', '--output_dir=unused'])

  def test_the_readme_table_lists_the_registry_algorithms(self):
    with open(os.path.join(_ROOT, 'README.md')) as f:
      table = f.read().split('<!-- algorithm-table', 1)[1]
    rows = re.findall(r'^\| \[[^\]]+\]\(([^)]+)\) \| [^|]+ \| `(\w+)` \|',
                      table.split('\n\n', 1)[0], re.MULTILINE)
    self.assertEqual([name for _, name in rows], list(registry.names()))
    for link, name in rows:
      self.assertEqual(link, f'docs/algorithms/{name}.md')
    pages = os.listdir(os.path.join(_ROOT, 'docs', 'algorithms'))
    self.assertCountEqual(pages, [f'{n}.md' for n in registry.names()])

  def test_every_committed_result_is_shown(self):
    shown = set()
    for path in render_docs.markdown_files():
      with open(path) as f:
        shown.update(re.findall(r'<!-- generated:benchmark:(\w+)[:\w]* -->',
                                f.read()))
    self.assertEqual(sorted(shown), render_docs.results_names())

  def test_no_commit_hashes_dates_or_machine_nicknames(self):
    for path in render_docs.markdown_files():
      with open(path) as f:
        text = f.read()
      with self.subTest(file=os.path.relpath(path, _ROOT)):
        self.assertEmpty([h for h in re.findall(r'\b[0-9a-f]{7,40}\b', text)
                          if re.search(r'\d', h) and re.search('[a-f]', h)])
        self.assertNotRegex(text, r'\b20\d\d-\d\d-\d\d\b')
        self.assertNotRegex(text, r'(?i)\bmachine [12]\b')


if __name__ == '__main__':
  # absltest parses the program's flags too, and --output_dir is required
  # (a value, not a default: docs/running.md shows the defaults).
  sys.argv.append('--output_dir=unused')
  absltest.main()
