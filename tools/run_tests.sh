#!/usr/bin/env bash
# Runs every Bazel test (offline) and ends with the line CI reads: "N passed, N failed".
# Extra arguments go to `bazel test` (e.g. a target pattern instead of //...).
# Exit status: 0 only if the build succeeded and every test target passed.
set -uo pipefail
cd "$(dirname "$0")/.."

# Data locations for tests: a shared/ copy sits beside the clone in CI.
if [[ -z "${TFF_FAIR_DATA_DIR:-}" && -d ../shared/data ]]; then
  export TFF_FAIR_DATA_DIR="$(realpath ../shared/data)"
fi
export TFF_FAIR_FASHION_MNIST_DIR="${TFF_FAIR_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
[[ -n "${TFF_FAIR_DATA_DIR:-}" ]] || echo "warning: TFF_FAIR_DATA_DIR is unset and ../shared/data is missing" >&2
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
# Leave no Bazel server behind, whatever happens.
trap 'bazel shutdown >/dev/null 2>&1; rm -f "$log"' EXIT

bazel test "${flags[@]}" "${patterns[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

# Every test target that should have run: one that failed analysis gets no
# summary line below, so it is counted failed by being absent.
expr="tests($(IFS=+; echo "${patterns[*]}")) except attr(tags, '\bmanual\b', //...)"
expected="$(bazel query --keep_going "$expr" 2>/dev/null || true)"

# Bazel's per-target summary lines, e.g. "//tests:foo   (cached) PASSED in 3.2s",
# "FAILED in 2 out of 3", "TIMEOUT in 300.0s", "NO STATUS", "FAILED TO BUILD".
read -r passed failed < <(awk '
  FILENAME == ARGV[1] { if ($1 ~ /^\/\//) result[$1] = "fail"; next }
  /^\/\/[^ ]+ +/ {
    status = $0; sub(/^[^ ]+ +/, "", status); sub(/^\(cached\) /, "", status)
    if (status ~ /^(PASSED|FLAKY)/) result[$1] = "pass"
    else if (status ~ /^(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|REMOTE FAILURE)/) result[$1] = "fail"
  }
  END { p = f = 0; for (t in result) { if (result[t] == "pass") p++; else f++ } print p, f }
' <(echo "$expected") "$log")

status=0
case $rc in
  0) ;;
  3) status=1 ;;
  4) echo "error: no test targets found" >&2; status=1 ;;
  *) # Build/loading error: count it even if no target line says so.
     status=1; [[ $failed -gt 0 ]] || failed=1 ;;
esac
[[ $failed -eq 0 ]] || status=1
echo "$passed passed, $failed failed"
exit $status
