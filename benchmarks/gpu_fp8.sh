#!/usr/bin/env bash
# Issue 67's FP8 run (docs/gpu.md, "FP8 weights"): on the lent machine (Python 3.12, torch and triton
# in the image, no package registry), from the repository root, with .whl/ carried (prepared here by
# benchmarks/gpu_wheels.sh). Installs radixlm as gpu_check.sh does, then runs each step time-boxed
# with its output in $OUT, so one failure does not hide the others, and ends with $OUT/summary.txt:
#   tests     tests/gpu and tests/triton: the CUDA tests (the engine with --quantization fp8 against
#             its dequantized reference among them) and every Triton kernel compiled against its
#             reference (the FP8 GEMM's included)
#   one-batch decode tok/s at bs 1 and 64 on the Llama-3-8B shape (random weights), bfloat16 weights,
#             then FP8 weights (--quantization fp8: the GEMM tuned on first use), each against the
#             HBM roofline of its own bytes per step (FP8: 1 byte a weight + the scales, the LM head
#             in bf16); CUDA graphs at exactly the measured batch sizes (--cuda-graph-bs 1 64)
#   offline   the share of decode time outside the forward, overlap on and off (gpu_check.sh's step
#             5), if time is left
# A step is skipped when less time is left than it may take (BUDGET_S, default 420 s in all); the
# limits keep both one-batch steps inside the budget even when the tests run to theirs.
#
# The lead's call: run(command="bash benchmarks/gpu_fp8.sh", carry=[".whl"], kind="nvidia-h200",
#                      timeout_s=480)
# A dry run of the plumbing on a CPU (no install, a tiny random model, tiny sizes, the FP8 GEMM in
# Triton's interpreter; tests/gpu skip):
#   GPU_CHECK_DRY=1 OUT=/tmp/gpu_fp8_dry bash benchmarks/gpu_fp8.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_fp8}
mkdir -p "$OUT"
START=$(date +%s)
BUDGET=${BUDGET_S:-420}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export RADIXLM_DISABLE_KERNELS=1  # the native CPU kernels are not needed on CUDA
export RADIXLM_GPU_TOKENIZER=$PWD/.whl/smollm2-tokenizer
TOK=$RADIXLM_GPU_TOKENIZER
PY=python3
: > "$OUT/steps.txt"
DEVICE=cuda DTYPE=bfloat16 BS="1 64" IN=256 OUTLEN=32 N=64
BIG=benchmarks/configs/llama3-8b.json MID=benchmarks/configs/llama3.2-1b.json
TESTS="tests/gpu tests/triton" INTERPRET=
if [ -n "${GPU_CHECK_DRY:-}" ]; then
  DEVICE=cpu DTYPE=bfloat16 BS="1 2" IN=16 OUTLEN=4 N=4
  echo '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 49152,
    "max_position_embeddings": 2048, "tie_word_embeddings": false}' > /tmp/gpu_fp8_tiny.json
  BIG=/tmp/gpu_fp8_tiny.json MID=$BIG
  TESTS="tests/gpu tests/triton/test_fp8_linear.py"
  INTERPRET="env TRITON_INTERPRET=1"  # FP8 is CUDA-only: on a CPU only under the interpreter
  [ -d "$TOK" ] || TOK=$($PY -c "from radixlm.model.loader import default_model_path as d; print(d())")
fi

. benchmarks/gpu_lib.sh

# --- install ---------------------------------------------------------------------------------------
install

# --- (a) the CUDA tests and the Triton kernels compiled --------------------------------------------
step tests 180 tests.log $PY -m pytest -q -rs -p no:cacheprovider --timeout 120 $TESTS

# --- (b) one-batch on Llama-3-8B's shape: bf16 weights, then FP8 -----------------------------------
OB="-m radixlm.cli bench one-batch --device $DEVICE --dtype $DTYPE --cuda-graph-bs $BS --batch-size $BS --input-len $IN --output-len $OUTLEN --output-file $OUT/results.jsonl --model-path $BIG"
step one-batch-bf16 80 one_batch.log $PY $OB
step one-batch-fp8 130 one_batch.log $INTERPRET $PY $OB --quantization fp8

# --- (c) decode time outside the forward, overlap on (the CUDA default) and off ---------------------
OFF="-m radixlm.cli bench offline --device $DEVICE --model-path $MID --tokenizer-path $TOK --workload random --num-prompts $N --input-len $((IN / 2)) --output-len $((OUTLEN * 4)) --result-file $OUT/results.jsonl"
step offline-overlap 60 offline.log $PY $OFF
step offline-no-overlap 60 offline.log $PY $OFF --disable-overlap-schedule

$PY benchmarks/gpu_summary.py "$OUT" "gpu_fp8" | tee "$OUT/summary.txt"
echo "total: $(( $(date +%s) - START )) s"
