#!/usr/bin/env bash
# Issue 43's second GPU run (docs/gpu.md): where an 8B decode step's time goes, after gpu_check.sh
# measured 58% of the HBM roofline at batch 64. With .whl/ carried (benchmarks/gpu_wheels.sh):
#   sweep     the split-KV decode kernel alone at the 8B shape, batch 64, 288 and 2048 keys: the
#             backend's launch and (splits, BLOCK_N, warps, stages) against the copy rate
#   profile   one-batch on the 8B shape at batch 64, eager (every kernel timed by the profiler)
#   offline   the 8B shape's decode time outside the forward, overlap on and off
# run(command="bash benchmarks/gpu_tune.sh", carry=[".whl"], kind="nvidia-h200", timeout_s=...)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_tune}
mkdir -p "$OUT"
START=$(date +%s)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 RADIXLM_DISABLE_KERNELS=1
bash benchmarks/gpu_install.sh "$OUT"
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
BIG=benchmarks/configs/llama3-8b.json TOK=$PWD/.whl/smollm2-tokenizer
t() { echo "$1: exit $2 at $(( $(date +%s) - START )) s" | tee -a "$OUT/steps.txt"; }
timeout 110 python3 benchmarks/gpu_attn_sweep.py --batch-size 64 --context 288 2048 > "$OUT/sweep.log" 2>&1; t sweep $?
timeout 80 python3 -m radixlm.cli bench one-batch --device cuda --dtype bfloat16 --disable-cuda-graph --batch-size 64 \
  --input-len 256 --output-len 32 --model-path $BIG --profile --profile-dir "$OUT/prof" > "$OUT/profile.log" 2>&1; t profile $?
rm -f "$OUT"/prof/*.trace.json
OFF="-m radixlm.cli bench offline --device cuda --model-path $BIG --tokenizer-path $TOK --workload random --num-prompts 64 --input-len 128 --output-len 128"
timeout 50 python3 $OFF > "$OUT/offline.log" 2>&1; t offline-overlap $?
timeout 50 python3 $OFF --disable-overlap-schedule >> "$OUT/offline.log" 2>&1; t offline-no-overlap $?
grep "^best\|backend" "$OUT/sweep.log"; grep -E "overlap_schedule|decode_outside|output_throughput" "$OUT/offline.log"
head -30 "$OUT"/prof/*.txt
