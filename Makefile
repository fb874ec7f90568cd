# Two commands on a fresh machine: `make demo` and `make test`. Both depend on `make install`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU build of torch lies on this machine's disk; pinning it *before* installing the project
# means pip never resolves an unpinned torch (which would download a multi-GB CUDA build).
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
DEMO   := build/demo

export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: help install triton demo test test-fast test-properties lint docs serve-docs bench clean

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' Makefile | sed -E 's/:.*## /\t/' | expand -t 18

install: $(STAMP)  ## .venv with ctrkit and what its tests need (torch pinned to the CPU build)

# Real Triton for the repository tests (scripts/tritonserver.sh): the nvidia-pytriton wheel's tritonserver and Python
# backend in .venv (without its dependencies, which pin NumPy < 2), and .venv-triton for the backend's stub: ctrkit
# with NumPy < 2 (the stub builds string tensors for NumPy 1's layout).
TRITON_ENV   := .venv-triton
TRITON_STAMP := $(TRITON_ENV)/.installed
triton: $(TRITON_STAMP)  ## real Triton for the repository tests (.venv-triton)

$(TRITON_STAMP): $(STAMP)
	test -x $(TRITON_ENV)/bin/python || $(PYTHON) -m venv $(TRITON_ENV)
	$(TRITON_ENV)/bin/python -m pip install --quiet --disable-pip-version-check "$(TORCH)" "numpy<2"
	$(TRITON_ENV)/bin/python -m pip install --quiet --disable-pip-version-check "numpy<2" onnxruntime -e .
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps "nvidia-pytriton==0.7.0"
	touch $(TRITON_STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test,spark,serve,report]"
	touch $(STAMP)

demo: install  ## the main job end to end on built-in data (synth, train, evaluate, report)
	$(BIN)/ctrkit synth --out $(DEMO)/data --rows 300000 --seed 0 --overwrite
	rm -f $(DEMO)/train_log.jsonl  # the log appends: one run per demo
	$(BIN)/ctrkit train --model dlrm --dataset $(DEMO)/data --epochs 1 \
		--save-checkpoint $(DEMO)/dlrm.pt --log-path $(DEMO)/train_log.jsonl
	$(BIN)/ctrkit evaluate --checkpoint $(DEMO)/dlrm.pt --dataset $(DEMO)/data --mapping test
	$(BIN)/ctrkit report $(DEMO)/dlrm.pt --out $(DEMO)/report.html

lint: install  ## ruff check and format, mypy (pyproject.toml's [tool.mypy])
	$(BIN)/ruff check ctrkit tests benchmarks scripts
	$(BIN)/ruff format --check ctrkit tests benchmarks scripts
	$(BIN)/python -m mypy

# The documentation site: the generated pages (command-line reference, benchmarks) rewritten from the code
# and the result files, then built with warnings as errors (broken links and anchors included) into build/site.
docs: install  ## the documentation site into build/site (links checked)
	$(BIN)/python -m ctrkit.cli.reference docs
	$(BIN)/python benchmarks/render.py
	$(BIN)/mkdocs build --strict --site-dir build/site

# the site on http://127.0.0.1:8001 (search needs it served: browsers run no search worker for a page opened from disk)
serve-docs: docs  ## the site on http://127.0.0.1:8001
	$(BIN)/python -m http.server --bind 127.0.0.1 --directory build/site 8001

# the tests in one process a core (pytest-xdist), each test file in one process (its module fixtures built once)
test: install triton lint  ## lint and the whole suite
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=20

# the suite without its slow parts, Spark, the browser and CUDA (markers: tests/conftest.py)
test-fast: install  ## the suite without its slow parts, Spark, the browser and CUDA
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not slow and not spark and not browser and not cuda"

# the property-based suite with the nightly profile (many more generated rows, tables and model lives)
test-properties: install triton  ## the property-based suite, nightly profile (about 6 minutes on 2 cores)
	HYPOTHESIS_PROFILE=nightly $(BIN)/python -m pytest -q tests/properties

bench: install  ## the maintained benchmarks of this machine
	bash benchmarks/run_train.sh
	ROUNDS=2 bash benchmarks/run_train_models.sh
	bash benchmarks/run_preprocess.sh
	bash benchmarks/run_scale.sh
	bash benchmarks/run_inference.sh

clean:  ## remove .venv, .venv-triton and build/
	rm -rf $(VENV) $(TRITON_ENV) build .pytest_cache .ruff_cache
