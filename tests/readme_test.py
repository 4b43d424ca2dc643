"""The Python examples of README.md and docs/ run as written.

Each block marked `<!-- test: python NAME -->` runs here in-process, and
the test named after NAME checks what the example should show: the own
loops learn (Ditto's personal models beat its global model, Aequa's widths
order its accuracies), and the own-data recipe builds clients and a model.
"""

import contextlib
import io
import os
from typing import Any

from absl.testing import absltest
import numpy as np

from tff_fair import data
# Replaces TFF's import-time context, whose clean-up fails at exit.
from tff_fair.models import names as model_names
from tff_fair.runtime import local  # pylint: disable=unused-import
from tff_fair.training import config
from tff_fair.training import experiment
from tools import render_docs

_MARKER = 'test: python '


def _examples() -> dict[str, tuple[str, str]]:
  """NAME -> (where, code) of every Python block marked to run."""
  examples = {}
  for block in render_docs.code_blocks():
    if block.marker.startswith(_MARKER):
      name = block.marker[len(_MARKER):].strip()
      if name in examples:
        raise AssertionError(f'Two Python examples are named {name!r}.')
      examples[name] = (f'{block.path}:{block.line}', block.code)
  return examples


def _run(name: str) -> tuple[dict[str, Any], str]:
  """Executes example `name`; returns its globals and what it printed."""
  where, code = _examples()[name]
  # Keras looks up the caller's module name: give the example one.
  namespace = {'__name__': 'docs_example'}
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(code, where, 'exec'), namespace)  # pylint: disable=exec-used
  return namespace, out.getvalue()


class DocsExamplesTest(absltest.TestCase):

  def test_every_example_has_a_test(self):
    tested = {name.removeprefix('test_').replace('_', '-')
              for name in dir(self) if name.startswith('test_')}
    self.assertContainsSubset(_examples(), tested)

  def test_fedavg_loop(self):
    namespace, out = _run('fedavg-loop')
    self.assertIn('worst_10_mean', out)
    # 10 rounds of FedAvg on digits: far above chance (0.1).
    self.assertGreater(namespace['accuracy'].mean, 0.5)
    self.assertLen(namespace['results'], 8)

  def test_own_data(self):
    namespace, out = _run('own-data')
    self.assertIn('6 clients;', out)
    source, spec = namespace['source'], namespace['spec']
    self.assertEqual(source.name, data.OWN_SOURCE_NAME)
    self.assertEqual(spec.input_spec['x'].shape.as_list(), [None, 12, 12, 1])
    # The client data feeds the model it was built for (numpy's float64
    # and int64 arrays became the specs' float32 and int32).
    train = namespace['train']
    self.assertEqual(train.element_type_structure, spec.input_spec)
    batch = next(iter(
        train.create_tf_dataset_for_client(train.client_ids[0])))
    self.assertEqual(spec.build_keras(0)(batch['x']).shape[-1], 4)
    # Without a model name the error lists the names to choose from.
    with self.assertRaisesRegex(
        config.ConfigError,
        "No default model for data set 'own_data'; pass model_name .*"
        + ', '.join(model_names.PLAIN_MODELS)):
      experiment.model_spec_for(source)

  def test_ditto(self):
    namespace, out = _run('ditto')
    self.assertIn('personalized', out)
    # Two digits per client: the personal models beat the global model.
    self.assertGreater(namespace['personal_accuracy'],
                       namespace['global_accuracy'] + 0.1)
    self.assertLen(namespace['personal'], 4)

  def test_aequa(self):
    namespace, out = _run('aequa')
    self.assertIn('width 1.00: accuracy', out)
    curve = namespace['curve']
    # Trained: the full width far above chance, the narrowest below it.
    self.assertGreater(curve[-1], 0.5)
    self.assertLess(curve[0], curve[-1])
    rewarded = namespace['rewarded']
    # A larger contribution never gets a narrower width; no gain below 0.
    self.assertTrue(np.all(np.diff(rewarded.width) >= 0))
    self.assertTrue(np.all(rewarded.gain >= 0))

  def test_privacy_budget(self):
    namespace, out = _run('privacy-budget')
    lines = out.splitlines()
    self.assertLen(lines, 3)
    # What the page says the example prints is what it prints.
    where = _examples()['privacy-budget'][0].split(':')[0]
    with open(os.path.join(render_docs.ROOT, where)) as f:
      page = f.read()
    for line in lines:
      self.assertIn(line, page)
    # The last budget (8) met within 2% below it.
    self.assertGreater(namespace['spent'], 8 * 0.98)
    self.assertLessEqual(namespace['spent'], 8)


if __name__ == '__main__':
  absltest.main()
