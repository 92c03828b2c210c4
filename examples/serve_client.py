"""Query a running ``qkm serve``: wait until ready, then /model, /assign (JSON and binary), /search, /features.

Standard library + numpy only (no HTTP client to install)::

    qkm serve --port 8000 &                       # the demo model in models/
    python examples/serve_client.py http://127.0.0.1:8000

``make demo`` runs it against the model it has just trained. Exits with
status 1 if the server is not ready in time or any answer is unexpected.
"""

import argparse
import io
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

SAMPLE = Path(__file__).resolve().parents[1] / "qkm" / "datasets" / "fashion_mnist_2000.npz"


class Client:
    """Tiny HTTP client for the qkm service (urllib)."""

    def __init__(self, url, api_key=None):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def request(self, method, path, body=None, headers=None):
        req = urllib.request.Request(self.url + path, data=body, method=method,
                                     headers={**self.headers, **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def json(self, method, path, obj=None):
        body = json.dumps(obj).encode() if obj is not None else None
        status, _, content = self.request(method, path, body, {"Content-Type": "application/json"})
        if status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {status} {content[:300]!r}")
        return json.loads(content)

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.request("GET", "/readyz")[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.url} was not ready after {timeout:.0f} s")
            time.sleep(0.2)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--data", default=str(SAMPLE), help="npz with X (and y) to take query rows from "
                                                       "(default: the bundled Fashion-MNIST sample)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for /readyz (default: 60)")
    p.add_argument("--api-key", default=None, help="API key, if the server has one")
    args = p.parse_args()

    data = np.load(args.data)
    X, y = data["X"], data["y"] if "y" in data else None
    client = Client(args.url, args.api_key)
    t0 = time.perf_counter()
    client.wait_ready(args.wait)
    print(f"server ready after {time.perf_counter() - t0:.1f} s: {args.url}")

    info = client.json("GET", "/model")
    print(f"GET /model: {info['name']}: {info['kind']}, K={info['n_clusters']}, D={info['n_features']}, "
          f"nnz={info['nnz']} ({info['compression']:.1f}x smaller than dense), index={info['has_index']}, "
          f"features={info['has_features']}, backend={info['serving']['backend']}, {info['checksum'][:19]}...")

    rows = X[-5:]
    out = client.json("POST", "/assign", {"instances": rows.tolist()})
    print(f"POST /assign (JSON, 5 rows): labels {out['labels']}, squared distances "
          f"{[round(d) for d in out['sq_distances']]}"
          + (f"; true classes {y[-5:].tolist()}" if y is not None else ""))

    batch = np.ascontiguousarray(X[:256], dtype="<f4")
    t = time.perf_counter()
    status, headers, content = client.request("POST", "/assign", batch.tobytes(),
                                              {"Content-Type": "application/octet-stream", "X-Shape": "256,784"})
    ms = (time.perf_counter() - t) * 1e3
    if status != 200:
        raise RuntimeError(f"POST /assign (binary): HTTP {status} {content[:300]!r}")
    labels = np.frombuffer(content[:256 * 8], dtype="<i8")
    print(f"POST /assign (float32 body, 256 rows, {len(batch.tobytes())} bytes): {ms:.1f} ms, "
          f"X-Fields: {headers.get('X-Fields') or headers.get('x-fields')}, cluster sizes "
          f"{np.bincount(labels, minlength=info['n_clusters']).tolist()}")

    if info["has_index"]:
        out = client.json("POST", "/search", {"instances": X[-3:].tolist(), "k": 3})
        for i, (ids, dist) in enumerate(zip(out["indices"], out["distances"])):
            labels = f", their labels {out['labels'][i]}" if out.get("labels") is not None else ""
            true = f" (class {y[len(y) - 3 + i]})" if y is not None else ""
            itself = " (the row itself comes first: it is indexed)" if dist[0] == 0 else ""
            print(f"POST /search k=3, row {len(X) - 3 + i}{true}: neighbours {ids} at distances "
                  f"{[round(d, 1) for d in dist]}{labels}{itself}")

    if info["has_features"]:
        buf = io.BytesIO()
        np.save(buf, X[:2])
        status, _, content = client.request("POST", "/features", buf.getvalue(),
                                            {"Content-Type": "application/x-npy"})
        if status != 200:
            raise RuntimeError(f"POST /features: HTTP {status} {content[:300]!r}")
        feats = np.load(io.BytesIO(content))
        print(f"POST /features (npy, 2 rows): shape {feats.shape}, row 0 starts {np.round(feats[0, :4], 4).tolist()}")

    status, _, content = client.request("POST", "/assign", b'{"instances": [[1, 2, 3]]}',
                                        {"Content-Type": "application/json"})
    print(f"POST /assign with 3 features instead of 784: HTTP {status} {json.loads(content)['error']}")
    if status != 400:
        raise RuntimeError("a wrong feature count should give 400")

    _, _, content = client.request("GET", "/metrics")
    counts = [line for line in content.decode().splitlines() if line.startswith("qkm_requests_total")]
    print("GET /metrics:\n  " + "\n  ".join(counts))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as exc:
        print(f"serve_client: {exc}", file=sys.stderr)
        sys.exit(1)
