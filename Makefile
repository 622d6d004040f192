# kubeddp developer commands. `make demo` and `make test` set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Optional extra index for torch, e.g. https://download.pytorch.org/whl/cpu on a CPU-only laptop.
TORCH_INDEX ?=
IMAGE ?= kubeddp
TAG ?= $(shell $(PYTHON) -c "import re;print(re.search(r'__version__ = \"(.+)\"', open('trainer/__init__.py').read())[1])")

.PHONY: setup demo test test-fast lint bench k8s image image-cpu chart-lint e2e-kind clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

# The main job: a local 2-process DDP run (CPU, gloo) of the built-in character language model.
demo: setup
	$(BIN)/kubeddp train --nproc 2 --set checkpoint.dir=checkpoints/demo --set checkpoint.resume=never

# Every test: unit, integration (multi-process gloo, network namespaces), e2e (real docker).
test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q tests/unit

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint Dockerfile
	$(BIN)/shellcheck tests/e2e/*.sh tests/lint/*.sh .ci/run
	$(BIN)/yamllint -s .github/workflows
	tests/lint/actionlint.sh
	$(BIN)/python -m pytest -q tests/unit/test_chart_render.py -k lint

chart-lint: setup
	$(BIN)/python -m pytest -q tests/unit/test_chart_*.py

# A real cluster: kind + the Kubeflow operators (needs docker, kind, kubectl, helm).
# LEG = training-operator | trainer | indexedjob
LEG ?= training-operator
e2e-kind: setup
	tests/e2e/kind.sh $(LEG)

bench: setup
	$(BIN)/python -m tests.bench.run

k8s: setup
	$(BIN)/python -m kubeddp.tools.gen_k8s

image:
	docker build -t $(IMAGE):$(TAG) .

image-cpu:
	docker build --build-arg VARIANT=cpu -t $(IMAGE):cpu .

clean:
	rm -rf checkpoints bench-results .pytest_cache
