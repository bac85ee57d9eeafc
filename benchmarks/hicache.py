"""Hierarchical cache benchmarks (radixlm/bench/hicache.py; figures in docs/benchmarks.md):

python benchmarks/hicache.py restart --prefix-len 4000 --reps 3
python benchmarks/hicache.py shared --prefix-len 4000 --reps 3  # two servers, one Mooncake Store
python benchmarks/hicache.py gsp --max-total-tokens 3000
"""

import sys

from radixlm.bench.hicache import main

if __name__ == "__main__":
    sys.exit(main())
