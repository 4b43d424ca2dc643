# tff_fair: `make test` runs every test (Bazel, offline); `make demo` runs a short training.
# PYTHON picks the interpreter for a new venv: e.g. `make setup PYTHON=python3.11`.
PYTHON ?= python3
OUTPUT_DIR ?= runs/demo
DEMO_FLAGS ?= --algorithm=fedavg --dataset=fashion_mnist --partition=dirichlet \
	--alpha=0.5 --num_clients=10 --rounds=5 --output_dir=$(OUTPUT_DIR)

.PHONY: setup test demo

setup:
	@PYTHON="$(PYTHON)" tools/setup.sh

test: setup
	@tools/run_tests.sh

demo: setup
	.venv/bin/python -m programs.train $(DEMO_FLAGS)
