# Two entry points for a fresh machine: `make serve` and `make test`.
# Each creates .venv (Python >= 3.11) and installs the pinned dependencies when missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: serve test install clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "voxgate needs Python >= 3.11; run: make PYTHON=python3.11 ...")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/voxgate serve

test: $(STAMP)
	$(BIN)/ruff check voxgate tests
	$(BIN)/ruff format --check voxgate tests
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
