# Sourced by the GPU run scripts (gpu_check.sh, gpu_fp8.sh, gpu_overlap.sh): the time budget, the
# time-boxed step, and the install. Expects START, BUDGET and OUT set; writes $OUT/steps.txt.

left() { echo $((BUDGET - ($(date +%s) - START))); }

# step NAME TIMEOUT LOG CMD...: runs CMD under `timeout` if TIMEOUT seconds are left, appending to LOG.
step() {
  local name=$1 limit=$2 log=$3
  shift 3
  if [ "$(left)" -lt "$limit" ]; then
    echo "$name: skipped ($(left) s left, needs $limit)" | tee -a "$OUT/steps.txt"
    return
  fi
  local t0=$(date +%s)
  echo "=== $name: $*" >> "$OUT/$log"
  timeout --kill-after=10 "$limit" "$@" >> "$OUT/$log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/steps.txt"
}

# install: the carried wheels and radixlm (skipped in a dry run), then PYTHONPATH for both.
install() {
  [ -n "${GPU_CHECK_DRY:-}" ] || bash benchmarks/gpu_install.sh "$OUT"
  export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  $PY -c "import radixlm, xgrammar, fastapi, zmq, gguf; print('imports ok', radixlm.__file__)" >> "$OUT/env.log" 2>&1
  echo "install: done in $(( $(date +%s) - START )) s" | tee -a "$OUT/steps.txt"
}
