"""Server CPU and latency of one-JSON-row ``/search`` and ``/assign`` requests: this checkout against a reference one.

A/B of the serving overhead (goal: ``/search`` one row p99 <= 2 ms at concurrency 8). Rerun (from the
repository root; the reference is another checkout with its own venv, here main before the change)::

    mkdir -p benchmarks/.cache/ref-d95a66f && git archive d95a66f | tar -x -C benchmarks/.cache/ref-d95a66f
    make -C benchmarks/.cache/ref-d95a66f .venv/.installed
    .venv/bin/python benchmarks/studies/serve_search_overhead.py --ref-python benchmarks/.cache/ref-d95a66f/.venv/bin/python \\
        --in-process 2000 --out benchmarks/results/studies/serve_search_overhead2   # about 11 minutes (+ the model once)

What it does:

1. Trains (once, cached in ``benchmarks/.cache/``) the model of ``ann.py``'s service rows: QK-means
   K = 64, s = 3, seed 0 on the 60,000 Fashion-MNIST training images (/255, float32), with a
   ``qkm.ClusterIndex(model, random_state=0)`` of them (default ``nprobe="auto"``).
2. In each of ``--rounds`` rounds, in alternating order, starts ``qkm serve MODEL --no-access-log`` of this
   checkout (``new``), of the reference (``ref``, ``--ref-python``: its ``python -m qkm.cli``), the floor app
   of ``serve_floor.py`` (``floor``: ``floor_app``, parse + ``index.query`` + encode, nothing else; ``/search``
   only) and its bare ASGI app (``baseline``: uvicorn alone), each pinned to CPU 0 with the generator on
   CPU 1, and runs the closed loops of ``serve_load.py``: one JSON row per request (256 Fashion-MNIST test
   rows in turn), ``/search`` and ``/assign``, at concurrency 1 and 8, ``--warmup`` s unrecorded then
   ``--duration`` s recorded. Server CPU per request is read from ``/proc``.
3. Checks the first ``/search`` answer of each server against in-process ``index.query``, reports the median
   over rounds of every figure, with the machine load at each level.
4. With ``--in-process N``: runs ``_asgi_in_process.py`` with each checkout's python (new, ref, ref, new),
   which drives the ASGI app without sockets and times, per round, N one-row requests per endpoint and the
   model's own ``search`` of the same rows: the service's CPU per request without the HTTP stack, and
   ``/search`` minus the search call (the service's part, with most of a busy machine's noise taken out).
"""

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
sys.path.insert(0, str(REPO / "benchmarks"))

import serve_load as sl  # noqa: E402
from serve_floor import FLOOR_MODEL_ENV  # noqa: E402  (beside this file)

GOAL_P99_MS = 2.0
ENDPOINTS = ("/search", "/assign")
LEVELS = (1, 8)
#: Servers in the order of the tables: this checkout, the reference, the floor app, the bare app.
SERVERS = ["new", "ref", "floor", "baseline"]


def ensure_model(cache_dir, data_dir):
    """The K = 64 QK-means model with its ClusterIndex, trained and cached on first use; and the index."""
    import qkm
    from qkm.export import load_model, save_model

    path = Path(cache_dir) / "search_overhead_fmnist_k64_index.qkm"
    if not path.exists():
        X = sl.load_fashion(data_dir, "train")
        t = time.perf_counter()
        est = qkm.QKMeans(64, sparsity_level=3, random_state=0).fit(X)
        index = qkm.ClusterIndex(est, random_state=0).fit(X)
        print(f"trained QK-means K=64 and its index on {X.shape} in {time.perf_counter() - t:.0f} s", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_model(est, path, index=index)
    return path, load_model(path)


def start(kind, python, model, port, log_path):
    """(process, command) of one server, pinned to CPU 0, ready."""
    if kind in ("baseline", "floor"):
        if kind == "baseline":
            return sl.start_baseline(port, {0}, log_path)
        return sl.start_baseline(port, {0}, log_path, app="serve_floor:floor_app", app_dir=Path(__file__).resolve().parent,
                                 env={FLOOR_MODEL_ENV: str(model)})
    cmd = [python, "-m", "qkm.cli", "serve", str(model), "--port", str(port), "--no-access-log", "--workers", "1"]
    import subprocess

    proc = subprocess.Popen(cmd, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    sl.wait_ready(proc, f"http://127.0.0.1:{port}", "/readyz", log_path)
    return proc, cmd


def check_search(port, body, expected):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/search", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        got = json.loads(r.read())["indices"]
    if got != expected:
        raise AssertionError(f"/search answered {got}, in-process query {expected}")


def level(server, round_, proc, port, endpoint, c, bodies, args):
    requests = [sl.http_request(endpoint, b, "application/json") for b in bodies]
    load = round(os.getloadavg()[0], 2)
    cpu0 = sl.process_tree_cpu_seconds(proc.pid)
    lat, _, statuses, errors, (answered, _) = asyncio.run(sl.closed_loop(port, requests, c, args.warmup,
                                                                        args.duration))
    cpu = (sl.process_tree_cpu_seconds(proc.pid) - cpu0) * 1e3 / max(answered, 1)
    row = dict(server=server, round=round_, endpoint=endpoint, concurrency=c, requests=len(lat),
               requests_per_s=len(lat) / args.duration, p50_ms=float(np.percentile(lat, 50) * 1e3),
               p99_ms=float(np.percentile(lat, 99) * 1e3), server_cpu_ms=cpu, load_1min=load,
               non_200=int(len(lat) - statuses.get(200, 0)), transport_errors=len(errors))
    print(f"  round {round_} {server:8s} {endpoint} c={c}: {row['requests_per_s']:6.0f} req/s p50 "
          f"{row['p50_ms']:6.2f} ms p99 {row['p99_ms']:6.2f} ms, server CPU {cpu:.3f} ms/req, load {load}",
          flush=True)
    return row


def summarise(rows):
    """Median over rounds of each (server, endpoint, concurrency)."""
    keys = sorted({(r["server"], r["endpoint"], r["concurrency"]) for r in rows},
                  key=lambda k: (SERVERS.index(k[0]), k[1], k[2]))
    out = []
    for server, endpoint, c in keys:
        mine = [r for r in rows if (r["server"], r["endpoint"], r["concurrency"]) == (server, endpoint, c)]
        med = {f: float(np.median([r[f] for r in mine])) for f in ("requests_per_s", "p50_ms", "p99_ms",
                                                                   "server_cpu_ms", "load_1min")}
        out.append(dict(server=server, endpoint=endpoint, concurrency=c, rounds=len(mine), **med,
                        non_200=sum(r["non_200"] for r in mine),
                        transport_errors=sum(r["transport_errors"] for r in mine)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref-python", default=None,
                   help="python of the reference checkout's venv (qkm installed from it); omitted: no 'ref' rows")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="recorded seconds per level (default: 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="unrecorded seconds before each level (default: 1)")
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--cache-dir", default=str(REPO / "benchmarks" / ".cache"))
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    p.add_argument("--in-process", type=int, default=0, metavar="N",
                   help="also drive each checkout's ASGI app in-process (no sockets): N requests per endpoint and "
                        "round, in two runs per checkout (order new, ref, ref, new); default 0: skipped")
    args = p.parse_args()

    model_path, model = ensure_model(args.cache_dir, args.data_dir)
    Q = sl.load_fashion(args.data_dir, "test")[:256]
    bodies = [json.dumps({"instances": Q[i:i + 1].tolist()}).encode() for i in range(256)]
    expected = model.search(Q[:1])[1].tolist()
    servers = [("new", sys.executable)] + ([("ref", args.ref_python)] if args.ref_python else []) + \
        [("floor", None), ("baseline", None)]
    os.sched_setaffinity(0, {1})
    log = Path(args.cache_dir) / "serve_search_overhead.log"
    load_at_start = [round(v, 2) for v in os.getloadavg()]
    rows, commands = [], {}
    try:
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for server, python in order:
                port = sl.free_port()
                proc, cmd = start(server, python, model_path, port, log)
                commands[server] = sl._shown(cmd)
                try:
                    if server != "baseline":
                        check_search(port, bodies[0], expected)
                    for endpoint in (ENDPOINTS if server in ("new", "ref") else ("/search",)):
                        for c in LEVELS:
                            rows.append(level(server, rnd, proc, port, endpoint, c, bodies, args))
                finally:
                    code = sl.stop(proc)
                    if code != 0 and server in ("new", "ref"):  # the bare apps have no SIGTERM handler
                        raise RuntimeError(f"{server} exited with {code}; see {log}")
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count())))
    summary = summarise(rows)
    in_process = run_in_process(args, model_path, servers) if args.in_process else None
    report(args, commands, model, summary, rows, load_at_start, in_process)


def run_in_process(args, model_path, servers):
    """``{server: {endpoint: [CPU us/request per round], "load": [...]}}`` of ``_asgi_in_process.py``, each
    checkout's python in turn (new, ref, ref, new), pinned to CPU 0."""
    import subprocess

    pythons = [(name, python) for name, python in servers if python is not None]
    out = {name: {"load": []} for name, _ in pythons}
    for name, python in pythons + pythons[::-1]:
        load = round(os.getloadavg()[0], 2)
        cmd = [python, str(Path(__file__).resolve().with_name("_asgi_in_process.py")), str(model_path), str(args.in_process),
               str(args.rounds), args.data_dir]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True,
                             preexec_fn=lambda: os.sched_setaffinity(0, {0}))
        for endpoint, values in json.loads(res.stdout.strip().splitlines()[-1]).items():
            out[name].setdefault(endpoint, []).extend(values)
        out[name]["load"].append(load)
        print(f"  in-process {name}: {res.stdout.strip().splitlines()[-1]} us/request, load {load}", flush=True)
    return out


def report(args, commands, model, summary, rows, load_at_start, in_process=None):
    import qkm

    env = {"python": platform.python_version(), "numpy": np.__version__, "qkm": qkm.__version__,
           "cpus": os.cpu_count(), "load_average_at_start": load_at_start,
           "load_average_at_end": [round(v, 2) for v in os.getloadavg()]}
    new8 = next(r for r in summary if (r["server"], r["endpoint"], r["concurrency"]) == ("new", "/search", 8))
    goal = {"goal": f"/search one JSON row p99 <= {GOAL_P99_MS:g} ms at concurrency 8",
            "measured": f"{new8['p99_ms']:.2f} ms (median of {new8['rounds']} rounds)",
            "met": new8["p99_ms"] <= GOAL_P99_MS}
    print(f"{'MET' if goal['met'] else 'MISSED'} {goal['goal']}: {goal['measured']}")
    if not args.out:
        return
    info = model.index.describe()
    payload = {"command": sl._shown(sys.argv), "server_commands": commands, "environment": env,
               "index": {"n_lists": info.get("n_lists"), "nprobe": info.get("nprobe")},
               "summary": summary, "rows": rows, "goal": goal, "in_process_us_per_request": in_process}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    from _machine import stamp, stamp_md

    payload = stamp(payload)
    Path(args.out + ".json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    lines = ["# One-row `/search` and `/assign`: server CPU and latency, this checkout (`new`) against a reference "
             "(`ref`)", "", "Produced by `benchmarks/studies/serve_search_overhead.py`; rerun with:", "",
             f"    .venv/bin/python {sl._shown(sys.argv)}", "",
             "Model: QK-means K = 64, s = 3 on Fashion-MNIST (60,000 x 784, float32) with its "
             f"`ClusterIndex` ({info.get('n_lists')} lists, nprobe {info.get('nprobe')}). Each server: 1 worker "
             "pinned to CPU 0, the load generator (`serve_load.py`'s closed loop, HTTP/1.1 keep-alive) on CPU 1; "
             f"servers started one after the other, in alternating order, {args.rounds} rounds; "
             f"{args.warmup:g} s unrecorded then {args.duration:g} s recorded per level; medians over rounds. "
             "`baseline`: the bare ASGI app of `serve_load.py` on the same uvicorn (reads the body, answers `{}`); "
             "`floor`: `serve_floor.py`'s `floor_app`, the least an HTTP service can do for one JSON row of `/search` (reads the "
             "body, `orjson.loads`, `np.asarray`, `index.query`, `orjson.dumps`; no validation, no metrics). "
             f"Commands: {json.dumps(commands)}. Environment: {json.dumps(env)}.", "",
             "| server | endpoint | concurrency | requests/s | p50 ms | p99 ms | server CPU ms/request | "
             "load (1 min) | non-200 | lost |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary:
        lines.append(f"| {r['server']} | {r['endpoint']} | {r['concurrency']} | {r['requests_per_s']:,.0f} | "
                     f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['server_cpu_ms']:.3f} | {r['load_1min']:.2f} | "
                     f"{r['non_200']} | {r['transport_errors']} |")
    if in_process:
        lines += ["", f"In-process (`_asgi_in_process.py`: the ASGI app called directly, no sockets, pinned to CPU 0; "
                      f"{args.in_process} requests per endpoint and round, {args.rounds} rounds in each of two runs "
                      f"per checkout, order {', '.join([*in_process, *list(in_process)[::-1]])}; `floor /search`: "
                      "`serve_floor.floor_app` on the same bodies in the same rounds): server CPU per one-JSON-row "
                      "request, median (range).",
                  "", "| endpoint | " + " | ".join(f"{name} us/request" for name in in_process) + " | load (1 min) |",
                  "|---|" + "---|" * (len(in_process) + 1)]
        loads = [x for v in in_process.values() for x in v["load"]]
        for endpoint in ENDPOINTS + ("search call", "/search minus search call", "floor /search",
                                     "/search minus floor /search"):
            cells = []
            for v in in_process.values():
                if endpoint.startswith("/search minus "):
                    values = [a - b for a, b in zip(v["/search"], v[endpoint[len("/search minus "):]])]
                else:
                    values = v[endpoint]
                cells.append(f"{np.median(values):.0f} ({min(values):.0f}-{max(values):.0f})")
            lines.append(f"| {endpoint} | " + " | ".join(cells) + f" | {min(loads):.2f}-{max(loads):.2f} |")
    lines += ["", f"Goal: {goal['goal']}: {goal['measured']}: **{'met' if goal['met'] else 'missed'}**."]
    floor8 = next((r for r in summary if (r["server"], r["endpoint"], r["concurrency"]) == ("floor", "/search", 8)),
                  None)
    if floor8 is not None:
        lines.append(f"The floor app's p99 at concurrency 8: {floor8['p99_ms']:.2f} ms ("
                     f"{'above' if floor8['p99_ms'] > GOAL_P99_MS else 'within'} the goal on this machine, "
                     "at this load).")
    Path(args.out + ".md").write_text(stamp_md("\n".join(lines) + "\n", payload))


if __name__ == "__main__":
    main()
