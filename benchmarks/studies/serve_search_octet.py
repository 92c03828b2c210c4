"""One-row ``/search`` at concurrency 8 with a JSON body against a raw float32 body (the p99 goal).

Does skipping the JSON parse bring ``qkm serve``'s one-row ``/search`` under 2 ms at p99 with 8 requests in
flight? Rerun (from the repository root, with ``ann.py``'s cached model, or it is trained first)::

    .venv/bin/python benchmarks/studies/serve_search_octet.py --rounds 3 --out benchmarks/results/studies/serve_search_octet

``qkm serve MODEL`` (1 worker, pinned to CPU 0) answers the closed loop of ``serve_load.py`` (pinned to CPU 1,
HTTP/1.1 keep-alive, 8 connections) with 256 Fashion-MNIST test rows in turn, as ``{"instances": [[...]]}``
(``json``) or as 784 little-endian float32 values with ``X-Shape: 1,784`` (``octet``); the two bodies alternate
in every round (order swapped each round), ``--warmup`` s unrecorded then ``--duration`` s recorded. The first
answer of each body is checked against in-process ``index.query``. Reported per round and as medians over the
rounds: requests/s, p50 and p99 latency, the server's CPU per request.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
# A study: it lives in benchmarks/studies/ and imports the shared modules of benchmarks/ (the parent folder).
sys.path.insert(0, str(REPO / "benchmarks"))

import serve_load as sl  # noqa: E402

GOAL_P99_MS = 2.0


def bodies(Q):
    json_bodies = [json.dumps({"instances": Q[i:i + 1].tolist()}).encode() for i in range(256)]
    octet_bodies = [np.ascontiguousarray(Q[i:i + 1], dtype="<f4").tobytes() for i in range(256)]
    return {"json": [sl.http_request("/search", b, "application/json") for b in json_bodies],
            "octet": [sl.http_request("/search", b, "application/octet-stream", "X-Shape: 1,784\r\n")
                      for b in octet_bodies]}, json_bodies[0], octet_bodies[0]


def check(url, index, Q, first_json, first_octet):
    want = index.query(Q[:1])[1].tolist()
    for body, ctype, extra in ((first_json, "application/json", {}),
                               (first_octet, "application/octet-stream", {"X-Shape": "1,784"})):
        req = urllib.request.Request(url + "/search", data=body, method="POST",
                                     headers={"Content-Type": ctype, "Accept": "application/json", **extra})
        with urllib.request.urlopen(req, timeout=30) as r:
            raw, fields = r.read(), r.headers.get("X-Fields")
        if fields is None:  # a JSON answer
            got = json.loads(raw)["indices"]
        else:  # the arrays one after the other (serve/encode.py), indices first: "indices:<i8,..."
            assert fields.startswith("indices:<i8"), fields
            got = np.frombuffer(raw[:8 * len(want[0])], dtype="<i8").reshape(1, -1).tolist()
        if got != want:
            raise AssertionError(f"/search with a {ctype} body answered differently from index.query")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--cache-dir", default=str(REPO / "benchmarks" / ".cache"))
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    args = p.parse_args()

    import ann

    X, Q = ann.load_fashion(args.data_dir)
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    index = ann.cached_fmnist_index(cache, X)
    path = cache / "ann_fmnist_qkmeans_k64_index.qkm"
    requests, first_json, first_octet = bodies(Q)
    os.sched_setaffinity(0, {1})
    port = sl.free_port()
    proc, url, cmd = sl.start_server(path, port, 1, "numba", {0}, cache / "serve_search_octet.log")
    rows = []
    try:
        check(url, index, Q, first_json, first_octet)
        for rnd in range(args.rounds):
            for name in (("json", "octet") if rnd % 2 == 0 else ("octet", "json")):
                cpu0 = sl.process_tree_cpu_seconds(proc.pid)
                lat, _, statuses, errors, (answered, _) = asyncio.run(
                    sl.closed_loop(port, requests[name], 8, args.warmup, args.duration))
                cpu = (sl.process_tree_cpu_seconds(proc.pid) - cpu0) * 1e3 / max(answered, 1)
                rows.append(dict(round=rnd + 1, body=name, requests_per_s=len(lat) / args.duration,
                                 p50_ms=float(np.percentile(lat, 50) * 1e3), p99_ms=float(np.percentile(lat, 99) * 1e3),
                                 server_cpu_ms=cpu, non_200=int(len(lat) - statuses.get(200, 0)),
                                 transport_errors=len(errors), load1=os.getloadavg()[0]))
                r = rows[-1]
                print(f"round {r['round']} {name:5s} c=8: {r['requests_per_s']:,.0f} req/s p50 {r['p50_ms']:.2f} ms "
                      f"p99 {r['p99_ms']:.2f} ms, server CPU {cpu:.3f} ms/request, load {r['load1']:.2f}", flush=True)
    finally:
        exit_code = sl.stop(proc)
        os.sched_setaffinity(0, set(range(os.cpu_count())))
    med = {b: {k: statistics.median(r[k] for r in rows if r["body"] == b)
               for k in ("requests_per_s", "p50_ms", "p99_ms", "server_cpu_ms")} for b in ("json", "octet")}
    command = ".venv/bin/python benchmarks/studies/serve_search_octet.py " + " ".join(sys.argv[1:])
    lines = ["# One-row `/search` at concurrency 8: JSON body against raw float32", "",
             f"Command: `{command}`  ", f"Server: `{sl._shown(cmd)}` (exit status {exit_code}), pinned to CPU 0; "
             "load generator (`serve_load.py`'s closed loop, 8 connections) on CPU 1.", "",
             "| round | body | requests/s | p50 ms | p99 ms | server CPU ms/request | non-200 | load (1 min) |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['round']} | {r['body']} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['server_cpu_ms']:.3f} | {r['non_200']} | {r['load1']:.2f} |" for r in rows]
    lines += ["", "Medians over the rounds: " + "; ".join(
        f"{b}: p99 {m['p99_ms']:.2f} ms, p50 {m['p50_ms']:.2f} ms, {m['server_cpu_ms']:.3f} ms CPU/request"
        for b, m in med.items()),
        f"Goal (p99 <= {GOAL_P99_MS} ms at concurrency 8): " + ", ".join(
            f"{b} {'met' if med[b]['p99_ms'] <= GOAL_P99_MS else 'missed'}" for b in ("json", "octet")) + ".", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        import _bench_data as ts

        from _machine import stamp, stamp_md

        ts.write_text_atomic(args.out + ".json", json.dumps(stamp({"command": command, "rows": rows, "medians": med}),
                                                            indent=1) + "\n")
        ts.write_text_atomic(args.out + ".md", stamp_md(text))


if __name__ == "__main__":
    main()
