"""Load test of ``qkm serve`` on loopback: requests/s, rows/s, p50/p99 latency and errors under bounded load.

Rerun (from the repository root; about 3 minutes once the model is cached, plus 2-3 minutes the
first time to train it)::

    .venv/bin/python benchmarks/serve_load.py --out benchmarks/results/serve_load

What it does:

1. Trains (once, cached in ``benchmarks/.cache/``) QK-means with K = 64, s = 3,
   seed 0 on the 60,000 Fashion-MNIST training images (/255, float32), or reuses it.
2. Starts ``qkm serve MODEL --no-access-log`` on 127.0.0.1 (a free port), waits for ``/readyz``.
3. For each scenario and each concurrency level (closed loop: ``c`` connections,
   each sending its next request as soon as the previous answer arrived, HTTP/1.1
   keep-alive), runs ``--warmup`` seconds unrecorded then ``--duration`` seconds recorded:

   * ``json-1``: one row per request as ``{"instances": [[...]]}`` (rows of the
     Fashion-MNIST test set, 256 different bodies in turn);
   * ``binary-256``: 256 rows per request, raw little-endian float32 with
     ``X-Shape: 256,784`` (802,816-byte bodies).

   The first answer of each scenario is checked against in-process ``predict``. Past
   ``max_in_flight`` (64 by default) the server refuses with 503 + ``Retry-After``; the
   generator counts those answers apart, and a refused user waits the ``Retry-After``
   seconds before its next request, as a well-behaved client does (``--no-retry-after``:
   it retries at once). Every request must get a status: a connection error is a lost request.
4. Checks the server still answers (``/readyz``), then stops it with SIGTERM (it must exit
   with status 0).
5. Runs the same load against ``baseline``, a bare ASGI app on the same uvicorn
   that reads the body and answers ``{}`` (``--no-baseline`` skips it): the
   floor of the HTTP stack on this machine at that moment, to tell the cost of
   the service from the cost of uvicorn/h11 and of the machine's other load.
6. Writes ``<out>.json`` / ``<out>.md`` with the goals of the serving issue
   checked on the ``qkm serve`` rows.

The load generator is a minimal asyncio HTTP/1.1 client (pre-encoded requests,
no HTTP library) in this process. It shares the machine with the server: on a
2-core box they compete for the same cores, so by default the server is pinned
to CPU 0 and the generator to CPU 1 (``--server-cpus`` / ``--client-cpus``;
other tenants of the machine are not excluded). Server CPU time per request
is read from ``/proc`` and is less sensitive to that contention than latency.
"""

import argparse
import asyncio
import json
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

GOALS = {"p99_ms_json1_c8": 10.0, "rows_per_s_binary256": 50_000}


# -- model and data ------------------------------------------------------------------ #
def load_fashion(data_dir, split):
    from qkm.io import load_data

    name = "train-images-idx3-ubyte.gz" if split == "train" else "t10k-images-idx3-ubyte.gz"
    X, _ = load_data(str(Path(data_dir) / "fashion-mnist" / name))
    return np.ascontiguousarray(X, dtype=np.float32) / np.float32(255.0)


def ensure_model(cache_dir, data_dir):
    """Path of the K=64 QK-means model, trained and cached on first use."""
    import qkm
    from qkm.export import data_fingerprint, save_model

    path = Path(cache_dir) / "serve_fmnist_qkmeans_k64_s3_rs0.qkm"
    if path.exists():
        return path
    X = load_fashion(data_dir, "train")
    t = time.perf_counter()
    est = qkm.QKMeans(n_clusters=64, sparsity_level=3, random_state=0).fit(X)
    print(f"trained QK-means K=64 on {X.shape} in {time.perf_counter() - t:.1f} s", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(est, path, extra_metadata={"data": "fashion-mnist train /255 float32",
                                          "data_fingerprint": data_fingerprint(X)})
    return path


# -- server -------------------------------------------------------------------------- #
async def baseline_app(scope, receive, send):
    """The floor of the HTTP stack: a bare ASGI app on the same uvicorn that reads the body and answers ``{}``."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


def wait_ready(proc, url, path, log_path):
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server not ready in time; see {log_path}")


def start_baseline(port, cpus, log_path, app="serve_load:baseline_app", app_dir=None, env=None):
    """An ASGI app (``module:attribute`` in ``app_dir``, default this file's bare app) on uvicorn, pinned to
    ``cpus``, ready; ``env``: extra environment variables (recorded in the returned command)."""
    cmd = [sys.executable, "-m", "uvicorn", app, "--app-dir", str(app_dir or REPO / "benchmarks"),
           "--port", str(port), "--no-access-log", "--log-level", "warning"]
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.Popen(cmd, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=preexec, env=None if not env else {**os.environ, **env})
    wait_ready(proc, f"http://127.0.0.1:{port}", "/", log_path)
    return proc, [f"{k}={v}" for k, v in (env or {}).items()] + cmd


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model, port, workers, backend, cpus, log_path):
    cmd = [str(REPO / ".venv" / "bin" / "qkm"), "serve", str(model), "--port", str(port), "--no-access-log",
           "--workers", str(workers), "--backend", backend]
    if not Path(cmd[0]).exists():
        cmd = [sys.executable, "-m", "qkm.cli", *cmd[1:]]
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.Popen(cmd, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=preexec)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, "/readyz", log_path)
    return proc, url, cmd


def process_tree_cpu_seconds(pid):
    """utime + stime of ``pid`` and its children, from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    try:
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / tick


def scrape_2xx(url, endpoint="/assign"):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    prefix = f'qkm_requests_total{{endpoint="{endpoint}",status="200"}} '
    return sum(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


# -- load generator ------------------------------------------------------------------ #
def http_request(path, body, content_type, extra_headers=""):
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra_headers}\r\n")
    return head.encode() + body


def _header(lower_head, name):
    i = lower_head.find(b"\r\n" + name + b":")
    if i < 0:
        return None
    i += len(name) + 3
    return lower_head[i:lower_head.index(b"\r\n", i)].strip()


async def read_response(reader):
    """``(status, body, Retry-After seconds or None)`` of one response."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    length = int(_header(lower, b"content-length"))
    retry_after = _header(lower, b"retry-after")
    return status, await reader.readexactly(length), float(retry_after) if retry_after else None


async def closed_loop(port, requests, concurrency, warmup, duration, honour_retry_after=True):
    """Latencies (s), status counts and transport errors over the recorded window, and all answers (warm-up too).

    A user refused with 503 waits the ``Retry-After`` seconds before its next request, as a well-behaved
    client does (``honour_retry_after=False``: it retries at once).
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    record_from, stop_at = start + warmup, start + warmup + duration
    latencies, statuses, errors = [], {}, []
    answered = [0, 0]  # all answers, 200 answers (warm-up included)

    async def user(offset):
        reader = writer = None
        i = offset
        while loop.time() < stop_at:
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                t0 = time.perf_counter()
                writer.write(requests[i % len(requests)])
                i += concurrency
                status, _, retry_after = await read_response(reader)
                t1 = time.perf_counter()
                answered[0] += 1
                answered[1] += status == 200
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                if loop.time() >= record_from:
                    errors.append(type(exc).__name__)
                if writer is not None:
                    writer.close()
                reader = writer = None
                continue
            if loop.time() >= record_from:
                latencies.append((t1 - t0, status))
                statuses[status] = statuses.get(status, 0) + 1
            if status == 503 and retry_after and honour_retry_after:
                await asyncio.sleep(min(retry_after, max(stop_at - loop.time(), 0.0)))
        if writer is not None:
            writer.close()

    await asyncio.gather(*(user(j) for j in range(concurrency)))
    lat = np.array([t for t, _ in latencies])
    return lat, np.array([status for _, status in latencies]), statuses, errors, answered


def check_first_answer(url, scenario, requests_payload, expected):
    """The server's answer to the scenario's first request equals in-process predict."""
    body, content_type, headers = requests_payload
    req = urllib.request.Request(url + "/assign", data=body, method="POST",
                                 headers={"Content-Type": content_type, **headers})
    with urllib.request.urlopen(req, timeout=30) as r:
        content = r.read()
    if scenario.startswith("json"):
        labels = np.array(json.loads(content)["labels"])
    else:
        labels = np.frombuffer(content[:len(expected) * 8], dtype="<i8")
    if not np.array_equal(labels, expected):
        raise AssertionError(f"{scenario}: the served labels differ from in-process predict")


# -- main ---------------------------------------------------------------------------- #
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=10.0, help="recorded seconds per level (default: 10)")
    p.add_argument("--warmup", type=float, default=2.0, help="unrecorded seconds before each level (default: 2)")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated levels (default: 1,8,32)")
    p.add_argument("--scenarios", default="json-1,binary-256")
    p.add_argument("--workers", type=int, default=1, help="qkm serve --workers (default: 1)")
    p.add_argument("--backend", choices=["numba", "onnx"], default="numba")
    p.add_argument("--server-cpus", default="0", help="CPUs the server is pinned to ('' = no pinning; default: 0)")
    p.add_argument("--client-cpus", default="1", help="CPUs the load generator is pinned to (default: 1)")
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--cache-dir", default=str(REPO / "benchmarks" / ".cache"))
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the bare-ASGI baseline on the same uvicorn (the floor of the HTTP stack)")
    p.add_argument("--no-retry-after", dest="retry_after", action="store_false",
                   help="refused (503) users retry at once instead of waiting the Retry-After seconds")
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    args = p.parse_args()
    levels = [int(v) for v in args.concurrency.split(",")]
    server_cpus = {int(v) for v in args.server_cpus.split(",")} if args.server_cpus else None
    client_cpus = {int(v) for v in args.client_cpus.split(",")} if args.client_cpus else None

    from qkm.export import load_model

    model_path = ensure_model(args.cache_dir, args.data_dir)
    model = load_model(model_path)
    queries = load_fashion(args.data_dir, "test")[:256]
    expected = model.predict(queries)
    payloads = {
        "json-1": [(json.dumps({"instances": queries[i:i + 1].tolist()}).encode(), "application/json", {})
                   for i in range(256)],
        "binary-256": [(queries.astype("<f4").tobytes(), "application/octet-stream", {"X-Shape": "256,784"})],
    }
    rows_per_request = {"json-1": 1, "binary-256": 256}

    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    requests = {scenario: [http_request("/assign", body, ct, "".join(f"{k}: {v}\r\n" for k, v in h.items()))
                           for body, ct, h in payloads[scenario]] for scenario in args.scenarios.split(",")}
    log_path = Path(args.cache_dir) / "serve_load_server.log"
    load_at_start = [round(v, 2) for v in os.getloadavg()]
    port = free_port()
    proc, url, cmd = start_server(model_path, port, args.workers, args.backend, server_cpus, log_path)
    results = []
    try:
        for scenario, reqs in requests.items():
            check_first_answer(url, scenario, payloads[scenario][0], expected[:rows_per_request[scenario]])
            for c in levels:
                results.append(measure("qkm serve", proc, port, url if args.workers == 1 else None, scenario,
                                       rows_per_request[scenario], reqs, c, args))
        with urllib.request.urlopen(url + "/readyz", timeout=10) as r:  # still serving after the load
            alive = r.status == 200
    finally:
        exit_code = stop(proc)
    baseline_cmd = None
    if args.baseline:
        port = free_port()
        proc, baseline_cmd = start_baseline(port, server_cpus, log_path)
        try:
            for scenario, reqs in requests.items():
                for c in levels:
                    results.append(measure("baseline", proc, port, None, scenario, rows_per_request[scenario],
                                           reqs, c, args))
        finally:
            stop(proc)
    report(args, cmd, baseline_cmd, model, results, {"exit_code": exit_code, "ready_after_load": alive,
                                                     "load_average_at_start": load_at_start})


def stop(proc):
    """SIGTERM, then the exit status (or a note if it had to be killed)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "killed after 60 s"


def measure(server, proc, port, metrics_url, scenario, rows, reqs, c, args):
    """One load level against one server: the result row (also printed)."""
    cpu0 = process_tree_cpu_seconds(proc.pid)
    served0 = scrape_2xx(metrics_url) if metrics_url else None
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    lat, lat_status, statuses, errors, (answered, answered_ok) = asyncio.run(closed_loop(port, reqs, c, args.warmup,
                                                                             args.duration, args.retry_after))
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu1 = process_tree_cpu_seconds(proc.pid)
    n, ok = len(lat), statuses.get(200, 0)
    row = {
        "server": server, "scenario": scenario, "concurrency": c, "rows_per_request": rows,
        "requests": n, "requests_per_s": n / args.duration, "ok_per_s": ok / args.duration,
        "rows_per_s": ok / args.duration * rows,
        "p50_ms": float(np.percentile(lat, 50) * 1e3) if n else None,
        "p99_ms": float(np.percentile(lat, 99) * 1e3) if n else None,
        "max_ms": float(lat.max() * 1e3) if n else None,
        "p99_ok_ms": float(np.percentile(lat[lat_status == 200], 99) * 1e3) if ok else None,
        "non_200": n - ok, "status_503": statuses.get(503, 0),
        "status_5xx_not_503": sum(v for k, v in statuses.items() if k >= 500 and k != 503),
        "transport_errors": len(errors), "statuses": {str(k): v for k, v in statuses.items()},
        "server_cpu_ms_per_request": (cpu1 - cpu0) * 1e3 / max(answered, 1),
        "client_cpu_ms_per_request": ((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime))
        * 1e3 / max(answered, 1),
        "answered_incl_warmup": answered,
        # /metrics must count what the client got (with one worker it sees every request)
        "metrics_2xx_match_client": (scrape_2xx(metrics_url) - served0 == answered_ok) if metrics_url else None,
    }
    row["errors"] = row["non_200"] - row["status_503"] + row["transport_errors"]  # 503 is the overload answer
    print(f"{server:9s} {scenario:10s} c={c:3d}: {row['requests_per_s']:8.1f} req/s {row['rows_per_s']:10.0f} rows/s "
          f"p50 {row['p50_ms']:7.2f} ms p99 {row['p99_ms']:7.2f} ms 503s {row['status_503']} errors {row['errors']} "
          f"(lost {row['transport_errors']}) server CPU {row['server_cpu_ms_per_request']:.3f} ms/req"
          f"{'' if row['metrics_2xx_match_client'] is not False else ' /metrics MISMATCH'}", flush=True)
    return row


def verdicts(results):
    """``(goal, measured, met)`` for the issue's goals, on the ``qkm serve`` rows."""
    results = [r for r in results if r["server"] == "qkm serve"]
    out = []
    c8 = [r for r in results if r["scenario"] == "json-1" and r["concurrency"] == 8]
    if c8:
        p99 = c8[0]["p99_ms"]
        out.append(("p99 < 10 ms, 1-row JSON, concurrency 8", f"{p99:.2f} ms", p99 < GOALS["p99_ms_json1_c8"]))
    binary = [r for r in results if r["scenario"] == "binary-256"]
    if binary:
        best = max(binary, key=lambda r: r["rows_per_s"])
        out.append(("≥ 50k rows/s, 256-row binary (best level)",
                    f"{best['rows_per_s']:,.0f} rows/s at c={best['concurrency']} "
                    f"({min(r['rows_per_s'] for r in binary):,.0f} at the worst level)",
                    best["rows_per_s"] >= GOALS["rows_per_s_binary256"]))
    lost = sum(r["transport_errors"] for r in results)
    out.append(("nothing lost: every request answered with a status", f"{lost} connection errors", lost == 0))
    errors = sum(r["errors"] for r in results)
    out.append(("no answer but 200 and 503 (overload, Retry-After); no 500",
                f"{errors} other answers, {sum(r['status_5xx_not_503'] for r in results)} 5xx other than 503, "
                f"503s per level: " + ", ".join(f"{r['scenario']} c={r['concurrency']}: {r['status_503']}"
                                                for r in results), errors == 0))
    return out


def _shown(cmd):
    """A command line with paths relative to the repository."""
    return " ".join(str(part).replace(str(REPO) + os.sep, "") for part in cmd)


def report(args, cmd, baseline_cmd, model, results, status):
    import qkm

    exit_code = status["exit_code"]
    env = {"python": platform.python_version(), "numpy": np.__version__, "qkm": qkm.__version__,
           "machine": platform.machine(), "cpus": os.cpu_count(),
           "load_average_at_start": status["load_average_at_start"],
           "load_average_at_end": [round(v, 2) for v in os.getloadavg()]}
    try:
        import fastapi
        import uvicorn

        env.update(fastapi=fastapi.__version__, uvicorn=uvicorn.__version__)
    except ImportError:
        pass
    model_info = {k: model.describe()[k] for k in ("kind", "n_clusters", "n_features", "nnz", "compression")}
    goals = verdicts(results)
    payload = {"command": _shown(sys.argv), "server_command": _shown(cmd),
               "baseline_command": _shown(baseline_cmd) if baseline_cmd else None, "args": vars(args),
               "environment": env, "model": model_info, "results": results, "server_exit_code": exit_code,
               "server_ready_after_load": status["ready_after_load"],
               "goals": [{"goal": g, "measured": m, "met": ok} for g, m, ok in goals]}
    print(f"qkm serve exit status after SIGTERM: {exit_code}")
    for g, m, ok in goals:
        print(f"{'MET   ' if ok else 'MISSED'} {g}: {m}")
    if not args.out:
        return
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    from _machine import stamp, stamp_md

    payload = stamp(payload)
    Path(args.out + ".json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    lines = [
        "# `qkm serve` under load on loopback",
        "",
        "Produced by `benchmarks/serve_load.py`; rerun with:",
        "",
        f"    .venv/bin/python {_shown(sys.argv)}",
        "",
        f"Model: Fashion-MNIST QK-means, K={model_info['n_clusters']}, D={model_info['n_features']}, "
        f"nnz={model_info['nnz']} ({model_info['compression']:.1f}x smaller than dense), float32, "
        f"`{args.backend}` backend, {args.workers} worker(s): `qkm {_shown(cmd[1:])}`, pinned to "
        f"CPU {args.server_cpus or 'any'}. Load generator (this script: asyncio, raw HTTP/1.1 keep-alive, "
        f"pre-encoded requests) pinned to CPU {args.client_cpus or 'any'}: on this {os.cpu_count()}-core "
        f"machine they share the cores with each other and with whatever else runs. Closed loop: `c` "
        f"connections, each sending its next request when the previous answer arrives "
        f"({'after the Retry-After seconds of a 503' if args.retry_after else 'at once, even after a 503'}); "
        f"{args.warmup:g} s "
        f"unrecorded, then {args.duration:g} s recorded per level. `baseline` is a bare ASGI app on the same "
        f"uvicorn (reads the body, answers `{{}}`): the floor of the HTTP stack on this machine at the same time. "
        f"Environment: {json.dumps(env)}.",
        "",
        "| server | scenario | concurrency | requests/s (all answers) | 200/s | rows/s | p50 ms | p99 ms | "
        "p99 of 200s ms | max ms | 503 | other errors | lost | server CPU ms/req | generator CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['server']} | {r['scenario']} | {r['concurrency']} | {r['requests_per_s']:,.0f} | "
                     f"{r['ok_per_s']:,.0f} | {r['rows_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                     f"{r['p99_ok_ms'] or float('nan'):.2f} | {r['max_ms']:.1f} | {r['status_503']} | {r['errors']} | {r['transport_errors']} | "
                     f"{r['server_cpu_ms_per_request']:.3f} | {r['client_cpu_ms_per_request']:.3f} |")
    lines += ["", "| goal (qkm serve rows) | measured | met |", "|---|---|---|"]
    lines += [f"| {g} | {m} | {'yes' if ok else '**no**'} |" for g, m, ok in goals]
    lines += ["", f"`qkm serve` answered `/readyz` after the load: {status['ready_after_load']}; its exit status "
              f"after SIGTERM: {exit_code}. With one worker, `/metrics` counted "
              "exactly the 200 answers the generator received at every level: "
              f"{all(r['metrics_2xx_match_client'] for r in results if r['metrics_2xx_match_client'] is not None)}."]
    Path(args.out + ".md").write_text(stamp_md("\n".join(lines) + "\n", payload))


if __name__ == "__main__":
    main()
