"""Benchmark: the long hostile contract run, tens of thousands of schemathesis requests per database
(not a test; run on demand, about 20-40 minutes per database on 2 cores).

    python bench/schemathesis_long.py --examples 700 --backend sqlite
    python bench/schemathesis_long.py --examples 700 --backend postgresql

CI runs `tests/api/test_schemathesis.py` with 30 valid and 30 invalid requests per operation. This runs
the same test (the same generation, the same checks: no 5xx, responses as declared, invalid data
refused, valid data accepted, pages still render after a write) with `--examples` of each per operation,
on one database, and prints how many requests were sent, the tally of their status codes, and the
operations that failed a check. Issue 38's goal: 0 responses >= 500 over >= 30,000 requests on each.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Outcomes:
    """A pytest plugin that keeps each failed operation's id and the first line of why."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        if report.passed:
            self.passed += 1
        elif report.failed:
            lines = str(report.longrepr).strip().splitlines()
            self.failed.append(f"{report.nodeid}: {lines[-1] if lines else '?'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=700, help="valid and invalid requests per operation")
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    args = parser.parse_args()
    os.environ["FSDP_PLANNER_SCHEMATHESIS_EXAMPLES"] = str(args.examples)
    sys.path.insert(0, str(ROOT))
    outcomes = Outcomes()
    started = time.perf_counter()
    code = pytest.main(
        [
            str(ROOT / "tests/api/test_schemathesis.py"), "-q", "-p", "no:cacheprovider",
            "-k", f"test_operation_conforms and {args.backend}", "--timeout", "0",
        ],
        plugins=[outcomes],
    )
    elapsed = time.perf_counter() - started
    from tests.api.test_schemathesis import STATUSES  # imported by the run above: its tally

    sent = sum(STATUSES.values())
    server_errors = sum(n for status, n in STATUSES.items() if status >= 500)
    print(f"\nmachine: {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"backend {args.backend}: {sent:,} requests checked in {elapsed / 60:.1f} min "
          f"({args.examples} valid + {args.examples} invalid per operation at most)")
    print("statuses: " + ", ".join(f"{status}: {n:,}" for status, n in sorted(STATUSES.items())))
    print(f"responses >= 500: {server_errors}; "
          f"operations passed {outcomes.passed}, failed {len(outcomes.failed)}")
    for line in outcomes.failed:
        print(f"  FAILED {line}")
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main())
