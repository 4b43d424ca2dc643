"""Exits 0 iff every `name==version` pin in the given lock file is installed."""

import importlib.metadata
import sys


def main(path):
  bad = []
  for line in open(path):
    line = line.split('#')[0].strip()
    if not line:
      continue
    name, sep, version = line.partition('==')
    if not sep:
      bad.append(line)  # not a pin: cannot verify
      continue
    try:
      installed = importlib.metadata.version(name.strip())
    except importlib.metadata.PackageNotFoundError:
      installed = None
    if installed != version.strip():
      bad.append(f'{name}=={version} (installed: {installed})')
  for item in bad:
    print('not satisfied:', item, file=sys.stderr)
  return 1 if bad else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1]))
