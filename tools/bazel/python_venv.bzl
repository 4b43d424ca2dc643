"""Repository rule: a Python toolchain that runs the project's virtualenv.

The venv lives at <workspace>/.venv (made by `make setup`), or wherever the
TFF_FAIR_VENV environment variable points. The path is worked out when Bazel
loads the workspace, so no absolute path is ever committed and a clone in any
folder finds its own venv. Third-party packages come from the venv, not Bazel.
"""

_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
    # The stub that launches each py_test runs under this interpreter too, so
    # nothing depends on a python3 being on the (strict) action PATH.
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _python_venv_impl(rctx):
    venv = rctx.os.environ.get("TFF_FAIR_VENV", "")
    if not venv:
        venv = "%s/.venv" % rctx.path(Label("@//:WORKSPACE")).dirname
    # Keep bin/python3 unresolved: Python finds the venv from the path it is run by.
    python = "%s/bin/python3" % venv
    if not rctx.path(python).exists:
        fail("No Python venv at %s: run `make setup` (or set TFF_FAIR_VENV)." % venv)
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD", _BUILD.format(python = python))

python_venv = repository_rule(
    implementation = _python_venv_impl,
    environ = ["TFF_FAIR_VENV"],
    # Re-evaluated on every Bazel server start, so a moved clone or a new venv is seen.
    local = True,
)
