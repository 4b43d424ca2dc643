"""The README's embedding example runs as written and learns."""

import contextlib
import io
import os
import re

from absl.testing import absltest
import tensorflow as tf


def _readme_example() -> str:
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                      'README.md')
  with open(path) as f:
    text = f.read()
  match = re.search(r'<!-- readme-example:start -->\n```python\n(.*?)```',
                    text, re.DOTALL)
  if match is None:
    raise AssertionError('README.md lost its readme-example block.')
  return match.group(1)


class ReadmeExampleTest(absltest.TestCase):

  def test_example_runs_and_trains(self):
    # Keras looks up the caller's module name: give the example one.
    namespace = {'__name__': 'readme_example'}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      exec(compile(_readme_example(), 'README.md', 'exec'), namespace)  # pylint: disable=exec-used
    self.assertIn('worst_10_mean', out.getvalue())
    # 10 rounds of FedAvg on digits: far above chance (0.1).
    self.assertGreater(namespace['accuracy'].mean, 0.5)
    self.assertLen(namespace['results'], 8)


if __name__ == '__main__':
  absltest.main()
