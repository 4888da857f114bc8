"""Cost of the replay buffer's near-duplicate clustering (``near_duplicate_jaccard``): milliseconds per added
sample as one prompt's buffer grows, on synthetic 20-token completions with Zipf-distributed token ids (common
tokens are shared by many clusters, as in text).

    python benchmarks/replay_cluster_cost.py [--samples 20000] [--jaccard 0.3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rllib_tba.tba_replay_buffer import TBAReplayBuffer, TBSample  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--jaccard", type=float, default=0.3)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    buf = TBAReplayBuffer(capacity=10**7, per_prompt_capacity=10**7, near_duplicate_jaccard=args.jaccard)

    def one():
        tokens = (rng.zipf(1.3, size=20) % 49152).astype(np.int32)  # SmolLM2's vocabulary size
        return TBSample(0, (1,), tokens, float(rng.normal()), 0)

    checkpoints = {n for n in (1000, 5000, 10000, 20000, 50000, 100000) if n <= args.samples} | {args.samples}
    for n in range(1, args.samples + 1):
        buf.add([one()])
        if n in checkpoints:
            t = time.perf_counter()
            buf.add([one() for _ in range(100)])
            print(f"{len(buf):>7} samples, {buf.num_clusters:>6} clusters: "
                  f"{(time.perf_counter() - t) * 10:.2f} ms per added sample", flush=True)


if __name__ == "__main__":
    main()
