#!/usr/bin/env bash
# Issue 43's one GPU run (docs/gpu.md, "The GPU run"): on the lent machine (Python 3.12, torch and
# triton in the image, no package registry), from the repository root, with .whl/ carried (prepared
# here by benchmarks/gpu_wheels.sh). Installs radixlm, then runs each step time-boxed with its output
# in $OUT, so one failure does not hide the others, and ends with $OUT/summary.txt:
#   tests     the CUDA tests (tests/gpu: engine vs HF, CUDA graphs vs eager, overlap, structured output)
#             and, after the 8B one-batch, the Triton kernels compiled against their references (tests/triton)
#   one-batch decode tok/s at bs 1/8/32/64/128, bf16, random weights of three shapes (Llama-3-8B first,
#             Llama-3.2-1B, SmolLM2-135M: benchmarks/configs), with the share of the HBM roofline
#   offline   the share of decode time outside the forward, with and without overlap scheduling
#   serving   radixlm serve + bench serving: random, gsp, multi-turn (if time is left)
# Steps are skipped when less time is left than they may take (BUDGET_S, default 470 s in all).
#
# The lead's call: run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], kind="nvidia-h200",
#                      timeout_s=600)
# A dry run of the plumbing on a CPU (no install, a tiny random model, tiny sizes; tests/gpu skip):
#   GPU_CHECK_DRY=1 OUT=/tmp/gpu_check_dry bash benchmarks/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
START=$(date +%s)
BUDGET=${BUDGET_S:-470}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export RADIXLM_DISABLE_KERNELS=1  # the native CPU kernels are not needed on CUDA: no minute spent building them
export RADIXLM_GPU_TOKENIZER=$PWD/.whl/smollm2-tokenizer
TOK=$RADIXLM_GPU_TOKENIZER
PY=python3
: > "$OUT/steps.txt"
DEVICE=cuda DTYPE=bfloat16 BS="1 8 32 64 128" IN=256 OUTLEN=32 N=64 SN=128
BIG=benchmarks/configs/llama3-8b.json MID=benchmarks/configs/llama3.2-1b.json SMALL=benchmarks/configs/smollm2-135m.json
if [ -n "${GPU_CHECK_DRY:-}" ]; then
  DEVICE=cpu DTYPE=float32 BS="1 2" IN=16 OUTLEN=4 N=4 SN=8
  echo '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 49152,
    "max_position_embeddings": 2048, "tie_word_embeddings": true}' > /tmp/gpu_check_tiny.json
  BIG=/tmp/gpu_check_tiny.json MID=$BIG SMALL=$BIG
  [ -d "$TOK" ] || TOK=$($PY -c "from radixlm.model.loader import default_model_path as d; print(d())")
fi

. benchmarks/gpu_lib.sh

# --- install ---------------------------------------------------------------------------------------
install

# --- (a) the CUDA tests, (b) one-batch on the goal's shape, then the kernels compiled -----------------
PT="-m pytest -q -rs -p no:cacheprovider --timeout 150"
step tests-gpu 160 tests.log $PY $PT tests/gpu
OB="-m radixlm.cli bench one-batch --device $DEVICE --dtype $DTYPE --cuda-graph-max-bs 128 --batch-size $BS --input-len $IN --output-len $OUTLEN --output-file $OUT/results.jsonl"
step one-batch-llama3-8b 100 one_batch.log $PY $OB --model-path $BIG
[ -z "${GPU_CHECK_DRY:-}" ] && step tests-triton 150 tests.log $PY $PT tests/triton
step one-batch-llama3.2-1b 70 one_batch.log $PY $OB --model-path $MID
step one-batch-smollm2-shape 70 one_batch.log $PY $OB --model-path $SMALL

# --- (c) decode time outside the forward, overlap on (the CUDA default) and off ---------------------
OFF="-m radixlm.cli bench offline --device $DEVICE --model-path $MID --tokenizer-path $TOK --workload random --num-prompts $N --input-len $((IN / 2)) --output-len $((OUTLEN * 4)) --result-file $OUT/results.jsonl"
step offline-overlap 60 offline.log $PY $OFF
step offline-no-overlap 60 offline.log $PY $OFF --disable-overlap-schedule

# --- (d) serving -----------------------------------------------------------------------------------
if [ "$(left)" -ge 100 ]; then
  $PY -m radixlm.cli serve --device $DEVICE --model-path $BIG --tokenizer-path "$TOK" \
    --max-total-tokens 200000 --port 30123 --log-level warning >> "$OUT/serving.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 90); do
    $PY -c "import urllib.request as u; u.urlopen('http://127.0.0.1:30123/health', timeout=2)" 2>/dev/null && break
    sleep 1
  done
  SV="-m radixlm.cli bench serving --base-url http://127.0.0.1:30123 --tokenizer $TOK --ignore-eos --disable-tqdm --output-file $OUT/results.jsonl"
  step serving-random 40 serving.log $PY $SV --dataset random --num-prompts $SN --random-input-len $IN --random-output-len $((OUTLEN * 2))
  step serving-gsp 40 serving.log $PY $SV --dataset gsp --gsp-num-groups 4 --gsp-prompts-per-group $((SN / 8)) --gsp-system-prompt-len $((IN * 4)) --gsp-question-len 32 --gsp-output-len $OUTLEN
  step serving-multi-turn 40 serving.log $PY $SV --dataset multi-turn --num-conversations $((SN / 8)) --num-turns 4 --multi-turn-question-len 64 --multi-turn-output-len $OUTLEN
  kill "$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
else
  echo "serving: skipped ($(left) s left)" | tee -a "$OUT/steps.txt"
fi

$PY benchmarks/gpu_summary.py "$OUT" | tee "$OUT/summary.txt"
echo "total: $(( $(date +%s) - START )) s"
