"""What a clean run must not print: Python warnings and torch's logged ones (shared by the tests that
run the command line, launch bundles, calibration and validation as a person does)."""

from __future__ import annotations

import re

_WARNING_LINE = re.compile(r"\b[A-Z]\w*Warning: |^(\[rank\d+\]:)?W\d{4} \d", re.M)


def python_warnings(output: str) -> list[str]:
    """Lines of Python warnings (`UserWarning: ...`, `FutureWarning: ...`) and of torch's logged
    warnings (`[rank0]:W1126 04:57:00 ...`, `W1126 ...`) in a command's output. The trainer's own
    banners (`WARNING: training on SYNTHETIC tokens`) and settings (`NCCL_DEBUG=WARN`) are not."""
    return [line for line in output.splitlines() if _WARNING_LINE.search(line)]
