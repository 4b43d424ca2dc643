#!/usr/bin/env bash
# `make setup`: checks Python, installs the Debian packages the build needs, and
# (re)creates .venv from requirements.txt when it is missing or out of date.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.requirements.sha256"  # sha256 of the requirements.txt installed
APT_PACKAGES=(bazel-bootstrap dataset-fashion-mnist)

# --- Is the venv up to date? ---------------------------------------------------
want="$(sha256sum requirements.txt | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [[ -x "$VENV/bin/python" && -z "$have" ]]; then
  # A venv made by hand from the same lock: adopt it rather than spend 2 minutes.
  if "$VENV/bin/python" tools/check_requirements.py requirements.txt; then
    echo "$want" > "$STAMP"; have="$want"
  fi
fi
rebuild=true
[[ -x "$VENV/bin/python" && "$have" == "$want" ]] && rebuild=false

# --- Python 3.11: TFF 0.87 supports 3.9-3.11, and the lock's pins (array_record,
# etils, Markdown, pycparser) need 3.11 -----------------------------------------
python="$PYTHON"; $rebuild || python="$VENV/bin/python"
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "error: tff_fair needs Python 3.11 (TensorFlow Federated 0.87 and the pinned lock);" >&2
  if command -v "$python" >/dev/null; then
    echo "  '$python' is $("$python" --version 2>&1)." >&2
  else
    echo "  '$python' was not found." >&2
  fi
  echo "  Install one (e.g. apt-get install python3.11, or pyenv install 3.11) and run" >&2
  echo "  PYTHON=python3.11 make setup   (or: make setup PYTHON=/path/to/python3.11)" >&2
  $rebuild || echo "  (the existing $VENV uses it: delete $VENV to rebuild it)" >&2
  exit 1
fi

# --- Debian packages: Bazel 4 and the Fashion-MNIST files (offline) -----------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "Installing ${missing[*]} (apt-get)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "error: missing Debian packages. Install them with:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

# --- The venv: rebuilt from scratch whenever requirements.txt changes ----------
$rebuild || exit 0
echo "Creating $VENV from requirements.txt with $PYTHON (about 2 minutes)..."
# Debian's python3 needs python3-venv (ensurepip) to make a venv.
if ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "Installing python3-venv (apt-get)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  else
    echo "error: '$PYTHON' cannot create a venv (no ensurepip). Install it with:" >&2
    echo "  sudo apt-get install -y python3-venv" >&2
    exit 1
  fi
fi
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
log="$VENV/pip-install.log"
# pip prints many harmless warnings on these machines: keep them in the log.
if ! "$VENV/bin/pip" install --no-deps --disable-pip-version-check \
    -r requirements.txt >"$log" 2>&1; then
  echo "error: pip install failed; last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
echo "$want" > "$STAMP"  # written last: an interrupted install is redone next time
echo "Created $VENV."
