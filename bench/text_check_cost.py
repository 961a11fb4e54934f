"""Benchmark: what the request text check (api/text_check.py) costs a request (not a test; run on demand).

    python bench/text_check_cost.py [--repeats 200]

Every JSON or form request is read once more by the middleware that refuses NUL characters and lone
surrogates. Bodies without a `\\u` escape, a byte 0xED or a zero byte cannot hold either and are only
scanned for those bytes; the rest are parsed and walked. Timed: `check_json_body` on a plan request, a
1,000-sample calibration profile (about 100 KB) and a body at the 5 MB limit, each plain and with
one escape (the parse-and-walk path); and a stored plan's replay (`POST /api/v1/plans`, identical
inputs: 200 from the database) through the whole app in process, with the middleware and without.
Reports medians. Goal: under 1 ms for ordinary bodies; the replay's median moves by less than that.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from api.text_check import TextCheckMiddleware, check_json_body

PLAN = {"model": "llama-debug", "cluster": "1x2xcpu", "name": "bench",
        "training": {"seq_len": 256, "global_batch_tokens": 2048}}


def profile(samples: int) -> dict[str, Any]:
    return {
        "name": "bench", "gpu": "cpu",
        "fingerprint": {"device_name": "cpu", "device_count": 2, "gpus_per_node": 2, "backend": "gloo",
                        "torch_version": "2.13.0"},
        "matmul": [{"m": 64 + i, "n": 64, "k": 64, "dtype": "float32", "seconds": 1e-4}
                   for i in range(samples)],
    }


def median_ms(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def bodies() -> dict[str, bytes]:
    five_mb = json.dumps({"raw": {"log": ["x" * 1000] * 5000}}).encode()[: 5 * 1024 * 1024]
    plain = {"plan request": json.dumps(PLAN).encode(),
             "profile, 1,000 samples": json.dumps(profile(1000)).encode(), "5 MB body": five_mb}
    escaped = {f"{name} + one escape": body.replace(b'"bench"', b'"b\\u00e9nch"', 1) if b'"bench"' in body
               else body.replace(b'"x', b'"\\u00e9', 1) for name, body in plain.items()}
    return {**plain, **escaped}


def replay_ms(*, checked: bool, repeats: int) -> float:
    with tempfile.TemporaryDirectory() as data_dir:
        app = create_app(Settings(database_url=f"sqlite:///{data_dir}/bench.sqlite3"))
        if not checked:  # the same app with the middleware taken out
            app.user_middleware = [m for m in app.user_middleware if m.cls is not TextCheckMiddleware]
        with TestClient(app) as client:
            assert client.post("/api/v1/plans", json=PLAN).status_code in (200, 201)
            return median_ms(lambda: client.post("/api/v1/plans", json=PLAN), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    machine = platform.processor() or platform.machine()
    print(f"{machine}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    for name, body in bodies().items():
        took = median_ms(lambda b=body: check_json_body(b), args.repeats)
        print(f"check_json_body, {name} ({len(body):,} B): {took:.3f} ms")
    for checked in (False, True):
        took = replay_ms(checked=checked, repeats=args.repeats)
        print(f"replayed POST /api/v1/plans {'with' if checked else 'without'} the middleware: {took:.2f} ms")


if __name__ == "__main__":
    main()
