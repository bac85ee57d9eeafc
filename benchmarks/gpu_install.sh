#!/usr/bin/env bash
# On the lent GPU machine (docs/gpu.md): radixlm and the wheels benchmarks/gpu_wheels.sh put in .whl/
# into /tmp/site; the caller then sets PYTHONPATH=$PWD:/tmp/site. Usage: bash benchmarks/gpu_install.sh OUT_DIR
set -u
cd "$(dirname "$0")/.."
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || echo "editable install failed: PYTHONPATH instead"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
} > "$1/env.log" 2>&1
