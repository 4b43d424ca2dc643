"""Counts test cases from Bazel's test.xml files; prints skips by name.

Usage: test_summary.py TESTLOGS_DIR RESULTS_FILE
  RESULTS_FILE: one line per expected test target, "<label> pass|fail"
  (fail also for targets that never ran).

Prints each skipped test case as "skipped: <target> <Class.test>", then the
closing line "N passed, N failed" (", N skipped" when there are skips),
counting test cases. A failed target whose XML names no failed case (a
crash, a timeout, a build error) counts as one failed case, so a broken
target can never hide.
"""

import glob
import os
import sys
import xml.etree.ElementTree as ElementTree


def _cases(xml_path: str):
  """Yields (name, outcome) per test case: 'pass', 'fail' or 'skip'."""
  try:
    root = ElementTree.parse(xml_path).getroot()
  except (OSError, ElementTree.ParseError):
    return
  for case in root.iter('testcase'):
    name = f"{case.get('classname', '').split('.')[-1]}.{case.get('name')}"
    if (case.get('name') == 'test_session' and
        case.get('result') == 'suppressed'):
      # tf.test.TestCase's deprecated `test_session` method: always
      # "skipped (Not a test.)", it is no test of ours.
      continue
    if case.find('failure') is not None or case.find('error') is not None:
      yield name, 'fail'
    elif case.get('result') == 'suppressed' or case.find('skipped') is not None:
      yield name, 'skip'
    else:
      yield name, 'pass'


def main(testlogs: str, results_file: str) -> int:
  counts = {'pass': 0, 'fail': 0, 'skip': 0}
  skipped = []
  with open(results_file) as f:
    results = [line.split() for line in f if line.strip()]
  for label, status in results:
    package, _, name = label.lstrip('/').partition(':')
    target_dir = os.path.join(testlogs, package, name)
    # One test.xml, or one per shard (shard_1_of_2/test.xml, ...).
    xml_paths = sorted(glob.glob(os.path.join(target_dir, 'test.xml')) +
                       glob.glob(os.path.join(target_dir, 'shard_*',
                                              'test.xml')))
    target_counts = {'pass': 0, 'fail': 0, 'skip': 0}
    for xml_path in xml_paths:
      for case, outcome in _cases(xml_path):
        target_counts[outcome] += 1
        if outcome == 'skip':
          skipped.append(f'{label} {case}')
    if status == 'fail' and target_counts['fail'] == 0:
      target_counts['fail'] = 1
    if status == 'pass' and not any(target_counts.values()):
      target_counts['pass'] = 1  # No XML: count the target itself.
    for outcome, n in target_counts.items():
      counts[outcome] += n
  for line in skipped:
    print(f'skipped: {line}')
  if skipped:
    print('(skipped tests need data files absent here: see docs/data.md,'
          ' "Tests and the data they need")')
  summary = f"{counts['pass']} passed, {counts['fail']} failed"
  if counts['skip']:
    summary += f", {counts['skip']} skipped"
  print(summary)
  return 0


if __name__ == '__main__':
  sys.exit(main(*sys.argv[1:]))
