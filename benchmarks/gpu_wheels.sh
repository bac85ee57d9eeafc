#!/usr/bin/env bash
# Prepare, on a machine with PyPI, what the lent GPU machine lacks for benchmarks/gpu_check.sh
# (docs/gpu.md, "The GPU run"): radixlm's runtime dependencies missing from its image, as wheels for
# CPython 3.12 on manylinux x86_64, and SmolLM2's tokenizer (the default model's 98 MB file does not
# fit in what one call carries, 64 MiB; its tokenizer does). Everything goes to .whl/ (ignored by
# git; the call carries it: carry [".whl"]).
#
# Missing from the image (its package list: /work/.library/device/KINDS.md): gguf, pyzmq, fastapi
# (+ starlette, opentelemetry-api), pydantic (+ pydantic-core, annotated-types, typing-inspection,
# a typing-extensions recent enough for them), uvicorn, apache-tvm-ffi and xgrammar (its own
# dependencies are in the image). openai is used by radixlm.lang's OpenAI backend only: not carried.
# The versions are the ones this repository is tested with.
#
# Usage, from the repository root: bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
WHEELS=(
  gguf==0.19.0 pyzmq==27.3.0
  fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.16.0
  uvicorn==0.54.0 apache-tvm-ffi==0.1.15.post2 xgrammar==0.2.8
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${WHEELS[@]}"
# SmolLM2's tokenizer, converted from the default model's GGUF (tests/gpu's models use it), with its
# model's config.json beside it: --tokenizer-path takes a HF model directory.
python3 - <<'EOF'
from radixlm.model.loader import load_tokenizer

load_tokenizer().save_pretrained(".whl/smollm2-tokenizer")
EOF
cp benchmarks/configs/smollm2-135m.json .whl/smollm2-tokenizer/config.json
ls -la .whl
du -sh .whl
