"""Building a QK-means centroid operator at a wide shape: folding V vs streamed norms vs norms given.

A QK-means fit builds a new :class:`qkm.operator.FactorChainOperator` after
every kept refit, and a distributed fit builds one on every worker every
iteration. This times the three ways the operator can get its centroid norms
at the shape of the 20 Newsgroups fit (K = 100, D = 173,762, the QK-means
supports): folding the dense V (what every build did before; forced here with
``FOLD_MAX_BYTES``), the streaming pass over the chain (the default for a
large V), and the norms given by the caller (what the distributed workers get
with the factors). Repeats interleaved, medians, machine load recorded.

    .venv/bin/python benchmarks/studies/chain_operator_build.py
"""

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numba
import numpy as np

# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _bench_data as ts  # noqa: E402
from _machine import cpu_name, stamp, stamp_md  # noqa: E402

from qkm import _config  # noqa: E402
from qkm.operator._chain import FactorChainOperator  # noqa: E402
from qkm.operator._chain_calibration import ChainCalibration  # noqa: E402
from qkm.operator._chain_layout import random_chain  # noqa: E402

MODES = ("fold V (before)", "streamed norms", "norms given")


def build(factors, mode, norms):
    if mode == MODES[0]:
        _config.FOLD_MAX_BYTES = 1 << 62
    t0 = time.perf_counter()
    op = FactorChainOperator(factors, calibration=ChainCalibration(bit_identical=True),
                             norms=norms if mode == MODES[2] else None)
    seconds = time.perf_counter() - t0
    _config._reset()
    return seconds, op.holds_dense


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--features", type=int, default=173_762)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "studies" / "chain_operator_build"))
    args = ap.parse_args(argv)
    factors = random_chain(args.k, args.features, dtype=np.float64, seed=0)
    norms = FactorChainOperator(factors, calibration=ChainCalibration(bit_identical=True)).norms
    load_before = os.getloadavg()
    times = {m: [] for m in MODES}
    held = {}
    for rep in range(args.repeats):
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            seconds, held[mode] = build(factors, mode, norms)
            times[mode].append(seconds)
    report = dict(command=(".venv/bin/python benchmarks/studies/chain_operator_build.py " + shlex.join(sys.argv[1:])).strip(),
                  cpu=cpu_name(), threads=numba.get_num_threads(),
                  load_before=load_before, load_after=os.getloadavg(), n_clusters=args.k,
                  n_features=args.features, n_factors=len(factors), nnz=int(sum(f.nnz for f in factors)),
                  seconds=times, median_s={m: float(np.median(t)) for m, t in times.items()}, holds_dense=held)
    lines = ["# Building a factor-chain operator at K x D = "
             f"{args.k} x {args.features:,} ({len(factors)} factors, nnz {report['nnz']:,})", "",
             f"Command: `{report['command']}`  ", f"Machine: {report['cpu']}, numba threads {report['threads']}; "
             f"load (uptime) before {tuple(round(x, 2) for x in load_before)}, after "
             f"{tuple(round(x, 2) for x in report['load_after'])}. {args.repeats} interleaved repeats, medians.", "",
             "| how the norms are obtained | build s (median) | holds the dense V after |", "|---|---|---|"]
    lines += [f"| {m} | {report['median_s'][m]:.3f} | {held[m]} |" for m in MODES]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ts.write_text_atomic(out.with_suffix(".json"), json.dumps(stamp(report), indent=1))
    ts.write_text_atomic(out.with_suffix(".md"), stamp_md("\n".join(lines) + "\n"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
