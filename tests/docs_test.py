"""The docs hold what is true now: generated parts match their sources, and
every relative link in README.md and docs/ resolves."""

import os
import re

from absl.testing import absltest

from tools import render_docs

# [text](target) with a relative target; anchors and web links are skipped.
_LINK = re.compile(r'\[[^\]]*\]\((?!https?://|mailto:|#)([^)#\s]+)[^)]*\)')


class DocsTest(absltest.TestCase):

  def test_generated_parts_match_their_sources(self):
    self.assertEqual(render_docs.stale_files(), [],
                     'run: python -m tools.render_docs')

  def test_every_relative_link_resolves(self):
    for path in render_docs.markdown_files():
      with open(path) as f:
        text = f.read()
      for target in _LINK.findall(text):
        with self.subTest(file=os.path.relpath(path, render_docs.ROOT),
                          link=target):
          self.assertTrue(os.path.exists(
              os.path.join(os.path.dirname(path), target)))


if __name__ == '__main__':
  absltest.main()
