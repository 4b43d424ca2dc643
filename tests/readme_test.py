"""The README's code examples run as written: the own loops learn (Ditto's
personal models beat its global model), and the own-data recipe builds
clients and a model."""

import contextlib
import io
import os
import re
from typing import Any

from absl.testing import absltest
import tensorflow as tf

from tff_fair import data
# Replaces TFF's import-time context, whose clean-up fails at exit.
from tff_fair.models import names as model_names
from tff_fair.runtime import local  # pylint: disable=unused-import
from tff_fair.training import config
from tff_fair.training import experiment


def _readme_example(name: str = 'readme-example') -> str:
  """The python block between `<!-- name:start -->` and `<!-- name:end -->`."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                      'README.md')
  with open(path) as f:
    text = f.read()
  match = re.search(
      f'<!-- {name}:start -->\n```python\n(.*?)```\n<!-- {name}:end -->',
      text, re.DOTALL)
  if match is None:
    raise AssertionError(f'README.md lost its {name} block.')
  return match.group(1)


def _run(code: str) -> tuple[dict[str, Any], str]:
  """Executes README code; returns its globals and what it printed."""
  # Keras looks up the caller's module name: give the example one.
  namespace = {'__name__': 'readme_example'}
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(code, 'README.md', 'exec'), namespace)  # pylint: disable=exec-used
  return namespace, out.getvalue()


class ReadmeExampleTest(absltest.TestCase):

  def test_example_runs_and_trains(self):
    namespace, out = _run(_readme_example())
    self.assertIn('worst_10_mean', out)
    # 10 rounds of FedAvg on digits: far above chance (0.1).
    self.assertGreater(namespace['accuracy'].mean, 0.5)
    self.assertLen(namespace['results'], 8)

  def test_own_data_recipe(self):
    namespace, out = _run(_readme_example('readme-own-data'))
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

  def test_ditto_example_personalizes(self):
    namespace, out = _run(_readme_example('readme-example:ditto'))
    self.assertIn('personalized', out)
    # Two digits per client: the personal models beat the global model.
    self.assertGreater(namespace['personal_accuracy'],
                       namespace['global_accuracy'] + 0.1)
    self.assertLen(namespace['personal'], 4)


if __name__ == '__main__':
  absltest.main()
