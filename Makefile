# Two commands do all the set-up:
#   make study   install (once) and run the default study:  snakemake --cores $(CORES)
#   make test    install (once) and run the test suite
PYTHON ?= python3
VENV ?= .venv
CORES ?= 2
BIN := $(VENV)/bin

.PHONY: study test install clean-results

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[test]'
	touch $@

install: $(BIN)/.installed

study: install
	$(BIN)/snakemake --cores $(CORES)

test: install
	$(BIN)/python -m pytest -q

clean-results:
	rm -rf results/* .snakemake
