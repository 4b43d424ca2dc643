# tff_fair: `make test` runs every test (Bazel, offline); `make demo` runs a short training.
# PYTHON picks the interpreter for a new venv: e.g. `make setup PYTHON=python3.11`.
# The demo's output goes to OUTPUT_DIR; FLAGS adds or overrides program flags
# (later flags win), e.g. `make demo FLAGS="--rounds=1" OUTPUT_DIR=runs/quick`.
# DEMO_FLAGS replaces the demo's own settings altogether.
PYTHON ?= python3
OUTPUT_DIR ?= runs/demo
DEMO_FLAGS ?= --algorithm=fedavg --dataset=fashion_mnist --partition=dirichlet \
	--alpha=0.5 --num_clients=10 --rounds=5
FLAGS ?=

.PHONY: setup test demo

setup:
	@PYTHON="$(PYTHON)" tools/setup.sh

test: setup
	@tools/run_tests.sh

demo: setup
	.venv/bin/python -m programs.train $(DEMO_FLAGS) --output_dir=$(OUTPUT_DIR) $(FLAGS)
