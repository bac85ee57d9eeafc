#!/usr/bin/env bash
# Issue 67's overlap run (docs/gpu.md, "Decode time outside the forward"): on the lent machine, from
# the repository root, with .whl/ (benchmarks/gpu_wheels.sh) and .base/ (the tree before the
# change: `git archive BASE radixlm | tar -x -C .base`) carried. Each step time-boxed, its output in
# $OUT, ending with $OUT/summary.txt:
#   offline   bench offline (random, 64 prompts, 128 in / 256 out) on the Llama-3-8B shape with
#             overlap, this tree then the base tree, alternated twice; out tok/s and this tree's
#             share of decode time outside the forward (GPU time between events against
#             launch-to-launch wall time); then without overlap
#   tests     tests/gpu and tests/triton on the GPU
#   one-batch decode at bs 1 and 64 on the 8B shape (step time with its host-side prepare)
#   probe     one 8B decode step's GEMMs in a CUDA graph by path (benchmarks/gpu_gemm_probe.py)
# The lead's call: run(command="bash benchmarks/gpu_overlap.sh", carry=[".whl", ".base"],
#                      kind="nvidia-h200", timeout_s=590)
# A dry run on a CPU (tiny model, tiny sizes): GPU_CHECK_DRY=1 OUT=/tmp/gpu_overlap_dry bash benchmarks/gpu_overlap.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_overlap}
mkdir -p "$OUT"
START=$(date +%s)
BUDGET=${BUDGET_S:-520}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 RADIXLM_DISABLE_KERNELS=1
export RADIXLM_GPU_TOKENIZER=$PWD/.whl/smollm2-tokenizer
TOK=$RADIXLM_GPU_TOKENIZER PY=python3
: > "$OUT/steps.txt"
DEVICE=cuda N=64 IN=128 OUTLEN=256 BS="1 64"
BIG=benchmarks/configs/llama3-8b.json MID=benchmarks/configs/llama3.2-1b.json
TESTS="tests/gpu tests/triton"
if [ -n "${GPU_CHECK_DRY:-}" ]; then
  DEVICE=cpu N=4 IN=16 OUTLEN=8 BS="1 2"
  echo '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 49152,
    "max_position_embeddings": 2048, "tie_word_embeddings": true}' > /tmp/gpu_overlap_tiny.json
  BIG=/tmp/gpu_overlap_tiny.json MID=$BIG TESTS=tests/gpu
  [ -d "$TOK" ] || TOK=$($PY -c "from radixlm.model.loader import default_model_path as d; print(d())")
fi
. benchmarks/gpu_lib.sh
install
BASEPATH=$PWD/.base:/tmp/site
PYTHONPATH=$BASEPATH $PY -P -c "import radixlm; print('base', radixlm.__file__)" >> "$OUT/env.log" 2>&1

# offline MODEL TAG [ARGS...]: one bench offline run; TAG "base" runs the base tree.
offline() {
  local model=$1 tag=$2
  shift 2
  local res=$OUT/offline_$(basename $model .json)__$tag.jsonl
  local cmd=($PY -m radixlm.cli bench offline --device $DEVICE --model-path $model --tokenizer-path $TOK
    --workload random --num-prompts $N --input-len $IN --output-len $OUTLEN --cuda-graph-max-bs $N
    --result-file $res "$@")
  if [ "$tag" = base ]; then
    # -P: the working directory (this tree) not first on sys.path, so .base's radixlm is imported
    step "offline-$(basename $model .json)-base" 75 offline.log env PYTHONPATH=$BASEPATH $PY -P "${cmd[@]:1}"
  else
    step "offline-$(basename $model .json)-$tag" 75 offline.log "${cmd[@]}"
  fi
}

offline $BIG new
offline $BIG base
offline $BIG new
offline $BIG base
offline $BIG new-no-overlap --disable-overlap-schedule
step tests 200 tests.log $PY -m pytest -q -rs -p no:cacheprovider --timeout 120 $TESTS
step one-batch 80 one_batch.log $PY -m radixlm.cli bench one-batch --device $DEVICE --dtype bfloat16 \
  --cuda-graph-bs $BS --batch-size $BS --input-len 256 --output-len 32 \
  --output-file $OUT/results.jsonl --model-path $BIG
[ -z "${GPU_CHECK_DRY:-}" ] && step gemm-probe 70 probe.log $PY benchmarks/gpu_gemm_probe.py

# Tag each offline line with its build for the summary, then one results file.
for f in "$OUT"/offline_*.jsonl; do
  [ -e "$f" ] || continue
  tag=$(basename "$f" .jsonl); tag=${tag#offline_}
  $PY -c "import json,sys; [print(json.dumps({**json.loads(l), 'build': sys.argv[1]})) for l in open(sys.argv[2]) if l.strip()]" "$tag" "$f" >> "$OUT/results.jsonl"
  rm "$f"
done
{
  $PY benchmarks/gpu_summary.py "$OUT" "gpu_overlap"
  [ -e "$OUT/probe.log" ] && { echo "## one decode step's GEMMs in a CUDA graph (gpu_gemm_probe.py)"; grep '^{' "$OUT/probe.log"; }
} | tee "$OUT/summary.txt"
echo "total: $(( $(date +%s) - START )) s"
