#!/usr/bin/env bash
# On a machine with the package index, in the project's root, after `make install` made .venv:
# the Python packages the offline GPU machine lacks (vLLM's GPU wheel, Ray, the project's
# dependencies) for its Python 3.12, as xz parts of 58 MiB, and their checksums.
# Output: .gpu/site.part.aa, .ab, ... and .gpu/site.sha256 (.gpu/ is kept out of git).
set -euo pipefail
G=${G:-.gpu}
VLLM=${VLLM:-0.26.0}   # the newest vLLM whose wheel is built against the GPU machine's torch 2.11
GRPC=${GRPC:-1.84.0}   # the GPU machine's grpcio: Ray Serve's grpcio-reflection must match it
W=$(mktemp -d)
mkdir -p "$G" "$W/whl"
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx "/$G/" "$EXCLUDE" 2>/dev/null || echo "/$G/" >> "$EXCLUDE"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp"
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 \
         manylinux_2_35_x86_64 manylinux1_x86_64 linux_x86_64; do PLAT="$PLAT --platform $p"; done
# The CPU environment's own pins, less what the GPU machine already has (torch, CUDA libraries,
# Triton, transformers and its hub/tokenizer stack, numpy, numba, sympy, grpcio itself), less the
# CPU build of vLLM, and less the test-only tools (browser, plots, fuzzing, profiling).
HAS='torch|torchvision|torchaudio|triton|nvidia-|transformers|tokenizers|huggingface.hub|hf.xet'
HAS="$HAS|safetensors|grpcio=|numpy|numba|llvmlite|sympy|mpmath|networkx"
DEV='vllm|playwright|pyee|pyarrow|matplotlib|fonttools|contourpy|kiwisolver|cycler|schemathesis'
DEV="$DEV|hypothesis|pytest|py-spy|coverage"
.venv/bin/python -m pip freeze 2>/dev/null | grep -viE "^($HAS|$DEV)[=_.-]|^(-e |#)" \
  | grep -v ' @ ' | sed "s/^grpcio-reflection==.*/grpcio-reflection==$GRPC/" > "$W/pins.txt"
PIP_CONSTRAINT= python3 -m pip download -q --no-deps $PLAT -d "$W/whl" -r "$W/pins.txt" \
  "vllm==$VLLM"
PIP_CONSTRAINT= python3 -m pip install -q --no-deps --no-compile $PLAT --target "$W/site" \
  "$W"/whl/*.whl
# Large parts a one-GPU benchmark never loads: the FlashAttention-2 kernels (Hopper uses FA3),
# Ray's Java jars and RLlib.
rm -rf "$W"/site/vllm/vllm_flash_attn/_vllm_fa2_C* "$W"/site/ray/jars "$W"/site/ray/rllib
du -sh "$W/site"
rm -f "$G"/site.part.* "$G/site.sha256"
tar -C "$W/site" -cf - . | xz -T0 -6 | split -b 58M - "$G/site.part."
(cd "$G" && sha256sum site.part.* > site.sha256)
ls -la "$G"/site.*
rm -rf "$W"
