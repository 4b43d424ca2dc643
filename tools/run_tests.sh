#!/usr/bin/env bash
# Runs every Bazel test (offline) and ends with the line CI reads:
# "N passed, N failed" (test cases; ", N skipped" follows when tests were
# skipped for absent data files, each named on a "skipped:" line above it).
# Extra arguments go to `bazel test` (e.g. a target pattern instead of //...).
# Exit status: 0 only if the build succeeded and every test target passed.
set -uo pipefail
cd "$(dirname "$0")/.."

# Data locations for tests: a shared/ copy sits beside the clone in CI. Tests
# of files the repository cannot ship skip by name without it; with it (or
# with TFF_FAIR_DATA_DIR set) a missing file fails instead of skipping.
if [[ -z "${TFF_FAIR_DATA_DIR:-}" && -d ../shared/data ]]; then
  export TFF_FAIR_DATA_DIR="$(realpath ../shared/data)"
fi
export TFF_FAIR_FASHION_MNIST_DIR="${TFF_FAIR_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
if [[ -n "${TFF_FAIR_DATA_DIR:-}" ]]; then
  export TFF_FAIR_REQUIRE_DATA="${TFF_FAIR_REQUIRE_DATA:-1}"
else
  echo "note: no data folder (TFF_FAIR_DATA_DIR unset, no ../shared/data):" \
    "tests of MNIST, FEMNIST, Shakespeare, CIFAR-10 and SST-2 files will be skipped" >&2
fi
# Changes when `make setup` reinstalls the venv, so cached results are not reused.
export TFF_FAIR_VENV_STAMP="$(cat "${TFF_FAIR_VENV:-.venv}/.requirements.sha256" 2>/dev/null || echo none)"

flags=(--keep_going)
[[ "${CI:-}" == true ]] && flags+=(--config=ci)
patterns=()
for arg in "$@"; do
  if [[ $arg == -* ]]; then flags+=("$arg"); else patterns+=("$arg"); fi
done
[[ ${#patterns[@]} -gt 0 ]] || patterns=(//...)

log="$(mktemp)"
results="$(mktemp)"
# Leave no Bazel server behind, whatever happens.
trap 'bazel shutdown >/dev/null 2>&1; rm -f "$log" "$results"' EXIT

bazel test "${flags[@]}" "${patterns[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

# Every test target that should have run: one that failed analysis gets no
# summary line below, so it is counted failed by being absent.
expr="tests($(IFS=+; echo "${patterns[*]}")) except attr(tags, '\bmanual\b', //...)"
expected="$(bazel query --keep_going "$expr" 2>/dev/null || true)"

# Bazel's per-target summary lines, e.g. "//tests:foo   (cached) PASSED in 3.2s",
# "FAILED in 2 out of 3", "TIMEOUT in 300.0s", "NO STATUS", "FAILED TO BUILD".
awk '
  FILENAME == ARGV[1] { if ($1 ~ /^\/\//) result[$1] = "fail"; next }
  /^\/\/[^ ]+ +/ {
    status = $0; sub(/^[^ ]+ +/, "", status); sub(/^\(cached\) /, "", status)
    if (status ~ /^(PASSED|FLAKY)/) result[$1] = "pass"
    else if (status ~ /^(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|REMOTE FAILURE)/) result[$1] = "fail"
  }
  END { for (t in result) print t, result[t] }
' <(echo "$expected") "$log" | sort > "$results"
failed_targets=$(grep -c ' fail$' "$results" || true)

status=0
case $rc in
  0) ;;
  3) status=1 ;;
  4) echo "error: no test targets found" >&2; status=1 ;;
  *) # Build/loading error: count it even if no target line says so.
     status=1; [[ $failed_targets -gt 0 ]] || echo "//:build fail" >> "$results" ;;
esac
[[ $failed_targets -eq 0 ]] || status=1
testlogs="$(bazel info bazel-testlogs 2>/dev/null || true)"
"${TFF_FAIR_VENV:-.venv}/bin/python" tools/test_summary.py "$testlogs" "$results"
exit $status
