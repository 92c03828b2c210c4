"""What two processes gain on this machine for exactly the workers' Lloyd work, with no Dask at all.

The reference run behind the 2-worker goal of ``distributed.py`` (2 workers at
least 1.6x faster than 1 on the generated 2,000,000 x 100,000 CSR): the same
shard directory (``distributed.py``'s data and cache, ``qkm shard`` with
``--rows-per-shard``, default 500,000 -> 4 shards), the same K = 100 initial
centres, and per shard exactly what the Dask tasks run
(:func:`qkm.distributed._shard_tasks.lloyd_step` on a
:class:`~qkm.distributed._shard_tasks.Shard`: the compact pack made an
operator once per process and iteration, CSR assignment against the sparse
C^T, WCSS, per-cluster sums and counts, 1 numba thread). The centres are the
means after one Lloyd step from the initial centres (``--centres step1``, the
work of a measured iteration of ``distributed_phases.py``; ``init``: the
sparser initial centres themselves), the same in every iteration.

Two long-lived worker processes (``multiprocessing`` spawn) hold the shards;
the shards go to them as ``ShardedData`` gives them to 2 Dask workers
(contiguous, balanced on stored entries + rows). Configurations, run one after
the other in every round (a, b, c, a, b, c, ...):

* ``a  1 process``: process 1 runs all shards, one after the other (unpinned);
* ``b  2 pinned``: both processes start each iteration together (a barrier),
  each on its own shards, each pinned to one CPU (``os.sched_setaffinity`` on
  all its threads);
* ``c  2 unpinned``: the same, free to run on any CPU.

Per iteration: wall time (first start -> last end), each process's busy time
(wall time of its shard work), CPU time and involuntary context switches;
``CPUs used`` = CPU time / wall time (about 1 for a and 2 for b on an idle
machine). References, 1 vs 2 processes each doing the same fixed work
(speed-up = 2 x alone / together): ``triad``, numpy ``a[:] = b + s * c`` on
arrays far larger than the last-level cache (memory bound), and ``spin``, a
numba loop over an in-cache array (compute bound).

Reading: a/b is the most two workers can gain here; ``cpu sum / a`` above 1
is extra work when both run at once (caches, memory); ``spin`` near 2x with
``triad`` and a/b lower: memory is the ceiling; ``spin`` lower: the CPUs are
shared. With Linux autogroup scheduling (recorded) all processes of one
session share one fair share of the CPUs against other sessions, so under load
two processes get the CPU time of one: only an idle machine gives the verdict.
``uptime`` load is recorded before and after every configuration.

Usage::

    .venv/bin/python benchmarks/parallel_ceiling.py        # about 3 min on an idle machine (estimate)
    .venv/bin/python benchmarks/parallel_ceiling.py --rounds 3 --iters 1 --out benchmarks/results/parallel_ceiling_loaded
"""

import argparse
import importlib.util
import json
import os
import pickle
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
CONFIGS = ("a", "b", "c")
LABELS = {"a": "a 1 process", "b": "b 2 pinned", "c": "c 2 unpinned"}
REFERENCES = ("triad", "spin")


def _bench_module():
    """``distributed.py`` as a module: its data generator, shard cache and initial centres (loaded in the parent
    only, not in the spawned workers)."""
    spec = importlib.util.spec_from_file_location("distributed_bench", BENCH_DIR / "distributed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------- worker processes


def _pin(cpus):
    """Affinity of every thread of this process (numba's pool threads too, not only the caller)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that just ended
            pass


_SPIN = None  # _spin compiled (once per worker process)


def _spin(buf, reps):
    for _ in range(reps):
        for i in range(buf.shape[0]):
            buf[i] = buf[i] * 0.999999 + 1e-6
    return buf.sum()


class _Clock:
    """Busy (wall), CPU time and involuntary context switches of this process over a block."""

    def __enter__(self):
        self.ru = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu, self.t0 = time.process_time(), time.perf_counter()  # CLOCK_MONOTONIC: one clock for all processes
        return self

    def __exit__(self, *exc):
        self.t1 = time.perf_counter()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.record = {"start": self.t0, "end": self.t1, "busy": self.t1 - self.t0,
                       "cpu": time.process_time() - self.cpu, "nivcsw": ru.ru_nivcsw - self.ru.ru_nivcsw}


def _lloyd(shards, its, pack_bytes, ids, n_iters, barrier):
    from qkm.distributed import _shard_tasks as T

    out = []
    for _ in range(n_iters):
        pack = pickle.loads(pack_bytes)  # a new pack per iteration (Dask's scatter): new operator and C^T layouts
        if barrier is not None:
            barrier.wait(timeout=900)
        phases = {}
        with _Clock() as clock:
            for i in ids:
                part = T.lloyd_step(shards[i], pack, "ceiling", its[i])
                its[i] += 1
                for _, _, name, a, b in part.events:
                    phases[name] = phases.get(name, 0.0) + (b - a)
        out.append(dict(clock.record, phases=phases, affinity=sorted(os.sched_getaffinity(0))))
    return out


def _reference(kind, size, reps, barrier):
    if kind == "triad":
        n = size // 8
        a, b, c = np.empty(n), np.full(n, 1.0), np.full(n, 2.0)
        a[:] = b + 0.5 * c  # first touch of a and of the temporaries' pages
        if barrier is not None:
            barrier.wait(timeout=900)
        with _Clock() as clock:
            for _ in range(reps):
                a[:] = b + 0.5 * c
        return clock.record
    global _SPIN
    if _SPIN is None:
        from numba import njit

        _SPIN = njit(nogil=True)(_spin)
    spin = _SPIN
    buf = np.ones(size // 8)
    spin(buf, 1)
    if barrier is not None:
        barrier.wait(timeout=900)
    with _Clock() as clock:
        spin(buf, reps)
    return clock.record


def worker(conn, barrier, directory, shard_ids, own_session):
    """Loop of one worker process: load its shards, then run the parent's commands."""
    if own_session:  # its own session, hence its own autogroup: a fair share of the CPUs of its own
        os.setsid()
    from qkm import _config
    from qkm.io._shards import read_manifest
    from qkm.distributed import _shard_tasks as T

    everywhere = os.sched_getaffinity(0)
    manifest = read_manifest(directory)
    settings = {"block_rows": _config.REDUCE_BLOCK_ROWS, "dense_block_rows": _config.DENSE_BLOCK_ROWS,
                "n_threads": 1, "verify": True}  # ShardedData's settings (1 thread per task)
    shards = {i: T.Shard(manifest, i, settings) for i in shard_ids}
    its = dict.fromkeys(shard_ids, 0)  # the shards' Lloyd state advances one iteration per call
    conn.send("ready")
    while True:
        cmd, kw = conn.recv()
        if cmd == "stop":
            return
        _pin(set(kw.pop("cpus")) or everywhere)
        synced = barrier if kw.pop("together") else None
        if cmd == "partials":  # the shards' sums for the step-1 means (a state of their own)
            pack = pickle.loads(kw["pack"])
            res = [T.lloyd_step(shards[i], pack, "means", 0) for i in kw["ids"]]
        elif cmd == "lloyd":
            res = _lloyd(shards, its, kw["pack"], kw["ids"], kw["iters"], synced)
        else:
            res = _reference(cmd, kw["size"], kw["reps"], synced)
        conn.send(res)


# --------------------------------------------------------------------------- parent


class Workers:
    """Two spawned worker processes; ``run`` sends one command to some of them and waits for their answers."""

    def __init__(self, directory, slots, own_sessions=False):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.barrier = ctx.Barrier(2)
        self.pipes, self.procs = [], []
        for held in slots:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker, args=(child, self.barrier, directory, held, own_sessions),
                            daemon=True)
            p.start()
            self.pipes.append(parent)
            self.procs.append(p)
        for pipe in self.pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a worker failed to start")

    def run(self, cmd, per_worker):
        """``per_worker``: {worker index: keyword dict}; all of them start together when there are two."""
        together = len(per_worker) > 1
        for w, kw in per_worker.items():
            self.pipes[w].send((cmd, dict(kw, together=together)))
        return {w: self.pipes[w].recv() for w in per_worker}

    def close(self):
        for pipe in self.pipes:
            pipe.send(("stop", {}))
        for p in self.procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()


def step1_pack(workers, C0, all_ids):
    """Compact pack of the means after one Lloyd step from ``C0`` (partial sums of every shard, added in shard
    order; empty clusters keep their centre), and the pack of ``C0`` itself."""
    from qkm._reduce import means_from_csr_sums
    from qkm.distributed import _shard_tasks as T
    from qkm._kernels import centroid_sq_norms

    init = pickle.dumps(T.compact_pack((C0, centroid_sq_norms(C0))))
    parts = workers.run("partials", {0: {"pack": init, "ids": all_ids, "cpus": ()}})[0]
    total = parts[0]
    for p in parts[1:]:
        total = T.combine(total, p)
    sums = total.sums.tocsr()
    C1, shift = np.empty_like(C0), np.empty(C0.shape[0])
    means_from_csr_sums(sums.indptr, sums.indices, sums.data, total.counts, C0, C1, shift)
    return init, pickle.dumps(T.compact_pack((C1, centroid_sq_norms(C1)))), C1


def run_lloyd(workers, config, pack, slots, iters, cpus):
    if config == "a":
        ids = [i for held in slots for i in held]
        res = workers.run("lloyd", {0: {"pack": pack, "ids": ids, "iters": iters, "cpus": ()}})
    else:
        res = workers.run("lloyd", {w: {"pack": pack, "ids": held, "iters": iters,
                                        "cpus": (cpus[w],) if config == "b" else ()} for w, held in enumerate(slots)})
    its = []
    for k in range(iters):
        procs = [res[w][k] for w in sorted(res)]
        its.append({"wall": max(p["end"] for p in procs) - min(p["start"] for p in procs),
                    "procs": [{key: p[key] for key in ("busy", "cpu", "nivcsw", "phases", "affinity")}
                              for p in procs]})
    return its


def run_reference(workers, kind, mode, size, reps, cpus):
    if mode == "1p":
        res = workers.run(kind, {0: {"size": size, "reps": reps, "cpus": ()}})
    else:
        res = workers.run(kind, {w: {"size": size, "reps": reps, "cpus": (cpus[w],) if mode == "2p-pinned" else ()}
                                 for w in range(2)})
    procs = [res[w] for w in sorted(res)]
    return {"wall": max(p["end"] for p in procs) - min(p["start"] for p in procs),
            "procs": [{key: p[key] for key in ("busy", "cpu", "nivcsw")} for p in procs]}


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def lloyd_table(results):
    """Medians over rounds and iterations per configuration."""
    out = {}
    for config in CONFIGS:
        its = [it for r in results if r["config"] == config for it in r["iterations"]]
        if not its:
            continue
        n = len(its[0]["procs"])
        row = {"wall": med([it["wall"] for it in its]),
               "busy": [med([it["procs"][w]["busy"] for it in its]) for w in range(n)],
               "cpu": [med([it["procs"][w]["cpu"] for it in its]) for w in range(n)],
               "nivcsw": [med([it["procs"][w]["nivcsw"] for it in its]) for w in range(n)],
               "busy_sum": med([sum(p["busy"] for p in it["procs"]) for it in its]),
               "cpu_sum": med([sum(p["cpu"] for p in it["procs"]) for it in its]),
               "cpus_used": med([sum(p["cpu"] for p in it["procs"]) / it["wall"] for it in its])}
        for phase in ("assign", "assign/transpose", "sums"):
            row[phase] = [med([it["procs"][w]["phases"].get(phase, 0.0) for it in its]) for w in range(n)]
        out[config] = row
    return out


def reference_table(results):
    out = {}
    for kind in REFERENCES:
        rows = {m: [r for r in results if r["kind"] == kind and r["mode"] == m] for m in ("1p", "2p-pinned", "2p")}
        if not rows["1p"]:
            continue
        alone = med([r["wall"] for r in rows["1p"]])
        out[kind] = {"1p": alone}
        for m in ("2p-pinned", "2p"):
            if rows[m]:
                wall = med([r["wall"] for r in rows[m]])
                out[kind][m] = wall
                out[kind][m + " speedup"] = 2 * alone / wall
        for m, rs in rows.items():
            if rs:
                out[kind][m + " cpus used"] = med([sum(p["cpu"] for p in r["procs"]) / r["wall"] for r in rs])
    return out


def summarise(meta, refs):
    f3 = lambda v: f"{v:.3f}"  # noqa: E731
    lines = ["# Two-process ceiling of this machine for the workers' Lloyd work (no Dask)\n",
             f"Command: `{meta['command']}`  ",
             (f"Data: {meta['shape']}; per process (shards): {meta['slots']}"
              + (f" (stored entries + rows: a/b at most {meta['ideal']:.2f}x without contention)" if "ideal" in meta
                 else "") + f"; K = {meta['k']}, centres: "
              f"{meta['centres']} (C nnz {meta['centres_nnz']:,}); {meta['iters']} iteration(s) per configuration "
              f"and round, " if "centres" in meta else "References only, ")
             + f"{meta['rounds']} round(s) interleaved (a, b, c, references); medians (seconds)"
             + ("; every worker process in a session of its own (`--own-sessions`)" if meta.get("own_sessions")
                else "") + ".  ",
             f"Machine: {meta['cpu']}, {meta['n_cpus']} CPUs; qkm {meta['qkm']}, numba {meta['numba']}; load 1-min "
             f"at start {meta['load_start'][0]:.1f}, at end {meta['load_end'][0]:.1f} (per configuration below); "
             f"kernel autogroup scheduling {meta.get('autogroup', 'unknown')}.\n"]
    if meta.get("autogroup") == "on":
        lines[-1] = lines[-1][:-1] + " With autogroup on, the processes of one session share one fair share of the " \
            "CPUs against other sessions: under load 2 processes get about the CPU time of 1 (CPUs used), so only " \
            "a run on an otherwise idle machine measures the ceiling" + \
            (" (here each worker process had a session, so a share, of its own).\n" if meta.get("own_sessions")
             else ".\n")
    table = lloyd_table(meta["lloyd"])
    if table:
        lines += ["| configuration | wall / iter | process 1 busy / cpu | process 2 busy / cpu | busy sum | cpu sum | "
                  "CPUs used | assign (p1, p2) | sums (p1, p2) | invol. switches (p1, p2) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for config, row in table.items():
            cells = [f"{row['busy'][w]:.3f} / {row['cpu'][w]:.3f}" for w in range(len(row["busy"]))] + [""]
            lines.append(f"| {LABELS[config]} | **{row['wall']:.3f}** | {cells[0]} | {cells[1]} | "
                         f"{f3(row['busy_sum'])} | {f3(row['cpu_sum'])} | {row['cpus_used']:.2f} | "
                         f"{', '.join(map(f3, row['assign']))} | {', '.join(map(f3, row['sums']))} | "
                         f"{', '.join(f'{v:.0f}' for v in row['nivcsw'])} |")
        lines.append("")
        if "a" in table:
            a = table["a"]
            for config in ("b", "c"):
                if config in table:
                    r = table[config]
                    walls = {c: [it["wall"] for x in meta["lloyd"] if x["config"] == c for it in x["iterations"]]
                             for c in ("a", config)}
                    per_round = [x / y for x, y in zip(walls["a"], walls[config])]
                    lines.append(f"* **speed-up {LABELS['a']} / {LABELS[config]}: {a['wall'] / r['wall']:.2f}x** "
                                 f"(per round and iteration: {', '.join(f'{v:.2f}' for v in per_round)}); busy sum / "
                                 f"a: {r['busy_sum'] / a['busy_sum']:.2f}, cpu sum / a: "
                                 f"{r['cpu_sum'] / a['cpu_sum']:.2f}")
    if refs:
        lines += ["", "References (each process does the same fixed work; speed-up = 2 x alone / together; CPUs "
                  "used = CPU time of the processes / wall time):\n",
                  "| reference | 1 process s | 2 pinned s | speed-up | 2 unpinned s | speed-up | CPUs used 1p, 2 pinned, "
                  "2 unpinned |", "|---|---|---|---|---|---|---|"]
        for kind, r in refs.items():
            lines.append(f"| {meta['reference_names'][kind]} | {r['1p']:.3f} | {r.get('2p-pinned', float('nan')):.3f} "
                         f"| **{r.get('2p-pinned speedup', float('nan')):.2f}x** | {r.get('2p', float('nan')):.3f} | "
                         f"**{r.get('2p speedup', float('nan')):.2f}x** | "
                         + ", ".join(f"{r.get(m + ' cpus used', float('nan')):.2f}" for m in ("1p", "2p-pinned", "2p"))
                         + " |")
    lines += ["", "Runs (load 1-min before / after):\n"]
    for r in meta["lloyd"]:
        lines.append(f"* round {r['round']} {LABELS[r['config']]}: " + ", ".join(f"{it['wall']:.3f}"
                                                                                 for it in r["iterations"])
                     + f" s/iter, load {r['load'][0][0]:.1f} / {r['load'][1][0]:.1f}")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", default=None, help="distributed.py's cache (default: benchmarks/.cache)")
    p.add_argument("--data-dir", default=None, help="distributed.py's data folder (20 Newsgroups; unused here)")
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--features", type=int, default=100_000)
    p.add_argument("--density", type=float, default=1e-4)
    p.add_argument("--rows-per-shard", type=int, default=500_000)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--centres", choices=["step1", "init"], default="step1")
    p.add_argument("--iters", type=int, default=2, help="Lloyd iterations per configuration and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cpus", default=None, help="the two CPUs of the pinned runs (default: the first two allowed)")
    p.add_argument("--triad-mb", type=int, default=128, help="size of each triad array (>> last-level cache)")
    p.add_argument("--triad-reps", type=int, default=5)
    p.add_argument("--spin-reps", type=int, default=10_000_000, help="passes of the spin loop over 2 KB")
    p.add_argument("--no-references", action="store_true")
    p.add_argument("--no-lloyd", action="store_true", help="the references only")
    p.add_argument("--own-sessions", action="store_true",
                   help="each worker process in a session of its own (with autogroup scheduling: a CPU share each; "
                        "shows what the shared share does under load, not the machine's ceiling)")
    p.add_argument("--render", metavar="JSON", help="rewrite the Markdown of a saved run (JSON) and exit")
    p.add_argument("--out", default=str(BENCH_DIR / "results" / "parallel_ceiling"))
    args = p.parse_args()
    DB = _bench_module()
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        meta = dict(saved["meta"], **{k: saved[k] for k in ("commit", "machine") if k in saved})  # the run's, kept
        args.out = args.render[:-len(".json")]
        return print(save(args, meta, DB))

    args.cache_dir = args.cache_dir or str(DB.TS.CACHE_DIR)
    args.data_dir = args.data_dir or str(DB.TS.DEFAULT_DATA_DIR)
    args.datasets, args.ks = ["generated"], [args.k]
    sets, inits = DB.prepare(args)
    directory = sets["generated"]
    from qkm.io._shards import read_manifest
    from qkm.distributed._sharded_data import _balanced_slots

    manifest = read_manifest(directory)
    n_shards = len(manifest["shards"])
    work = [int(s.get("nnz", 0)) + int(s["n_rows"]) for s in manifest["shards"]]  # ShardedData.work
    owner = _balanced_slots(work, 2).tolist()
    slots = [[i for i in range(n_shards) if owner[i] == w] for w in range(2)]
    allowed = sorted(os.sched_getaffinity(0))
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else allowed[:2]
    if len(allowed) < 2:
        raise SystemExit("fewer than 2 CPUs allowed to this process: nothing to measure")

    import numba

    import qkm

    meta = {"command": " ".join([".venv/bin/python", "benchmarks/parallel_ceiling.py"] + sys.argv[1:]),
            "shape": f"generated {manifest['n_rows']:,} x {manifest['n_features']:,} CSR, nnz {manifest['nnz']:,}, "
                     f"{n_shards} shards", "slots": slots,
            "ideal": sum(work) / max(sum(work[i] for i in held) for held in slots), "k": args.k, "iters": args.iters, "rounds": args.rounds,
            "cpu": DB.cpu_name(), "n_cpus": len(allowed), "pinned_cpus": cpus, "qkm": qkm.__version__,
            "numba": numba.__version__, "load_start": DB.uptime_load(), "autogroup": autogroup(),
            "own_sessions": args.own_sessions,
            "reference_names": {"triad": f"triad `a[:] = b + s * c`, {args.triad_mb} MB arrays x {args.triad_reps}",
                                "spin": f"spin: numba loop over 2 KB x {args.spin_reps}"},
            "lloyd": [], "references": []}
    print(f"[{time.strftime('%H:%M:%S')}] starting 2 workers, shards {slots}, load {meta['load_start']}", flush=True)
    workers = Workers(directory, [[] for _ in slots] if args.no_lloyd else
                      [[i for held in slots for i in held], slots[1]], args.own_sessions)
    try:
        if not args.no_lloyd:
            C0 = np.ascontiguousarray(np.load(inits[f"generated:{args.k}"]), dtype=np.float64)
            init, step1, C1 = step1_pack(workers, C0, [i for held in slots for i in held])
            pack = step1 if args.centres == "step1" else init
            meta["centres"] = ("means after one Lloyd step from the initial centres" if args.centres == "step1"
                               else "the initial centres (k-means++ on a sample)")
            meta["centres_nnz"] = int(np.count_nonzero(C1 if args.centres == "step1" else C0))
            run_lloyd(workers, "c", pack, slots, 1, cpus)  # warm-up: kernels of both processes, the pack's sizes
        for rnd in range(args.rounds):
            for config in () if args.no_lloyd else CONFIGS:
                load0 = DB.uptime_load()
                its = run_lloyd(workers, config, pack, slots, args.iters, cpus)
                meta["lloyd"].append({"round": rnd + 1, "config": config, "iterations": its,
                                      "load": [load0, DB.uptime_load()]})
                print(f"[{time.strftime('%H:%M:%S')}] round {rnd + 1} {LABELS[config]}: "
                      f"{[round(it['wall'], 3) for it in its]} s/iter, load {load0[0]:.1f}", flush=True)
            if not args.no_references:
                for kind in REFERENCES:
                    size = args.triad_mb << 20 if kind == "triad" else 2048
                    reps = args.triad_reps if kind == "triad" else args.spin_reps
                    for mode in ("1p", "2p-pinned", "2p"):
                        load0 = DB.uptime_load()
                        r = run_reference(workers, kind, mode, size, reps, cpus)
                        meta["references"].append(dict(r, kind=kind, mode=mode, round=rnd + 1,
                                                       load=[load0, DB.uptime_load()]))
                print(f"[{time.strftime('%H:%M:%S')}] round {rnd + 1} references: {reference_table(meta['references'])}",
                      flush=True)
            save(args, dict(meta, load_end=DB.uptime_load()), DB)  # after every round: a partial run leaves results
    finally:
        workers.close()
    print(save(args, dict(meta, load_end=DB.uptime_load()), DB))


def autogroup():
    """Linux autogroup scheduling (CPU shared fairly between sessions first): "on", "off" or "unknown"."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as fh:
            return "on" if fh.read().strip() == "1" else "off"
    except OSError:
        return "unknown"


def save(args, meta, DB):
    table, refs = lloyd_table(meta["lloyd"]), reference_table(meta["references"])
    text = summarise(meta, refs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    payload = DB.stamp({"meta": meta, "lloyd_table": table, "reference_table": refs}, parts=[meta] if args.render else None)
    DB.TS.write_text_atomic(args.out + ".json", json.dumps(payload, indent=1))
    DB.TS.write_text_atomic(args.out + ".md", DB.stamp_md(text, payload))
    return text


if __name__ == "__main__":
    main()
