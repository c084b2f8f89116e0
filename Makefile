# Two commands do all the set-up:
#   make study   install (once) from requirements.lock and run the default study: snakemake --cores $(CORES);
#                its results land in results/<experiment>/ (docs/studies.md), and it says where
#   make test    install (once) from requirements.lock, check the lock against pyproject.toml, run the tests
#                but the `long` ones (within 5 min on 2 cores); make test-long runs those, make test-all both (CI)
# and one for the real-data study (docs/real-study.md):
#   make study-fashion   install Debian's dataset-fashion-mnist if missing (as root; else says what to run),
#                        build both regimes' backbones once (fashion-backbones: each study's `backbone`
#                        target, its pretraining), then run both regimes: study-fashion-far
#                        (studies/fashion_mnist.yaml, the backbone pretrained on 5 other classes) and study-fashion-near (studies/fashion_near.yaml, on
#                        a disjoint pool of all 10 classes' training images); each target runs one alone
#   make claims-regimes STUDIES="results/a results/b"   one claims table over two or more studies'
#                        results folders, a column per regime, nearest first (docs/search.md)
# and four for the pinned environment (docs/environment.md):
#   make install-slurm   the default install plus the Slurm executor plugin (docs/cluster-and-gpu.md)
#   make lock    re-resolve requirements.lock after editing pyproject.toml (keeps pins that still fit)
#   make lock-upgrade   the same, moving every pin to the newest release that fits
#   make conda-env      rewrite workflow/envs/pipeline.yaml (the rules' conda env) from the lock (lock does it too)
#   make golden  rerun the tiny study on the CPU and rewrite tests/golden/tiny_accuracy.csv
# and one for the docs (docs/architecture.md, "Tests"):
#   make docs    regenerate docs/configuration.md from workflow/schemas/config.schema.yaml
# and one for a GPU loan (docs/cluster-and-gpu.md, "The prepared GPU script"):
#   make gpu-bundle   results/gpu_bundle: the wheels and data benchmarks/run_gpu.sh needs on a bare CUDA machine
PYTHON ?= python3
VENV ?= .venv
CORES ?= 2
# pytest-xdist workers of `make test` (each test module stays on one worker: --dist loadscope)
TEST_WORKERS ?= 2
BIN := $(VENV)/bin
LOCK := requirements.lock
# The lock is for this target: Linux x86-64 (glibc >= 2.28), CPython 3.11.
LOCK_PYTHON := 3.11
LOCK_PLATFORM := x86_64-manylinux_2_28
# uv resolves the lock; it lives in its own venv, never in the project's.
UV_VERSION := 0.13.9
LOCKENV ?= $(VENV)/uv-env

.PHONY: install-slurm test-long test-all claims-regimes study study-fashion fashion-backbones study-fashion-far study-fashion-near fashion-mnist-data test install check-lock lock lock-upgrade conda-env golden docs gpu-bundle clean-results

# The lock minus the optional Slurm extra's own pins (pipeline_src/plan/lock_extras.py: Snakemake imports
# every installed executor plugin at each start); `make install-slurm` adds them (docs/cluster-and-gpu.md).
$(BIN)/.installed: $(LOCK) pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/python -m pipeline_src.plan.lock_extras --without slurm $(LOCK) --out $(VENV)/requirements-default.txt
	$(BIN)/pip install --require-hashes -r $(VENV)/requirements-default.txt
	$(BIN)/pip install --no-deps -e .
	touch $@

# The package's bytecode, as pip writes an installed package's: the editable install leaves it to
# Python, which writes none where PYTHONDONTWRITEBYTECODE is set (as on this project's build
# machines); every parse then compiled ~45 plan modules again, ~85 ms of each dry run
# (docs/performance.md). Up to date, this takes 0.05 s; a changed file is compiled again.
install: $(BIN)/.installed
	@$(BIN)/python -m compileall -q pipeline_src

# the whole lock: the default install and the Slurm executor plugin, pinned and hash-checked
install-slurm: install
	$(BIN)/pip install --require-hashes -r $(LOCK)

check-lock: install
	$(BIN)/python -m pipeline_src.plan.environment --check-lock $(LOCK)

study: install
	$(BIN)/snakemake --cores $(CORES)
	@echo "Results of this study: $$($(BIN)/python -m pipeline_src.plan.studies where)/ (report: report/index.md)"

FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
FASHION_FAR := studies/fashion_mnist.yaml
FASHION_NEAR := studies/fashion_near.yaml

fashion-mnist-data:
	@if [ ! -f $(FASHION_MNIST) ]; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y dataset-fashion-mnist; \
		else echo "Fashion-MNIST is not installed. Run:"; \
			echo "    sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist"; \
			echo "then: make $(MAKECMDGOALS)"; exit 1; fi; \
	fi

# The backbones first, by their own target: the 120-min budget of issue 42 holds the studies, not
# the pretraining (docs/real-study.md); a later study run finds them built. The target comes first:
# --configfile takes every word after it as a config file.
fashion-backbones: install fashion-mnist-data
	$(BIN)/snakemake backbone --cores $(CORES) --configfile $(FASHION_FAR)
	$(BIN)/snakemake backbone --cores $(CORES) --configfile $(FASHION_NEAR)

study-fashion: fashion-backbones study-fashion-far study-fashion-near
	$(BIN)/python -m pipeline_src.reports.cross_regime results/fashion-near results/fashion-far --out results/fashion-regimes
	@echo "Both regimes side by side: results/fashion-regimes/claims_by_regime.md"

study-fashion-far: install fashion-mnist-data
	$(BIN)/snakemake --cores $(CORES) --configfile $(FASHION_FAR)
	@echo "Results of this study: $$($(BIN)/python -m pipeline_src.plan.studies where --configfile $(FASHION_FAR))/ (report: report/index.md)"

study-fashion-near: install fashion-mnist-data
	$(BIN)/snakemake --cores $(CORES) --configfile $(FASHION_NEAR)
	@echo "Results of this study: $$($(BIN)/python -m pipeline_src.plan.studies where --configfile $(FASHION_NEAR))/ (report: report/index.md)"

PYTEST = $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: check-lock
	$(PYTEST) -m "not long"

test-long: check-lock
	$(PYTEST) -m long

test-all: test test-long

$(LOCKENV)/bin/uv:
	$(PYTHON) -m venv $(LOCKENV)
	$(LOCKENV)/bin/pip install uv==$(UV_VERSION)

UV_COMPILE = $(LOCKENV)/bin/uv pip compile pyproject.toml --extra test --extra slurm --generate-hashes \
	--python-version $(LOCK_PYTHON) --python-platform $(LOCK_PLATFORM) --custom-compile-command "make lock" --quiet -o $(LOCK)

lock: $(LOCKENV)/bin/uv
	$(UV_COMPILE)
	$(MAKE) conda-env

lock-upgrade: $(LOCKENV)/bin/uv
	$(UV_COMPILE) --upgrade
	$(MAKE) conda-env

# The venv's python when there is one; the module needs only the standard library (Python >= 3.11: tomllib).
conda-env:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m pipeline_src.plan.conda_env

# Two or more studies' results folders (results/<experiment>), and where the table goes.
STUDIES ?=
REGIMES_OUT ?= results/regimes

claims-regimes: install
	$(BIN)/python -m pipeline_src.reports.cross_regime $(STUDIES) --out $(REGIMES_OUT)

golden: install
	PIPELINE_UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q tests/e2e/test_golden.py

docs: install
	$(BIN)/python -m pipeline_src.plan.config_docs

gpu-bundle: install fashion-mnist-data
	bash benchmarks/build_gpu_bundle.sh results/gpu_bundle

# Every study's results (results/<experiment>/ for each) and Snakemake's metadata.
clean-results:
	rm -rf results/* .snakemake
