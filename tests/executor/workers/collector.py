"""The workers' garbage collector: no automatic full collections where a worker compares numbers
(losses, gradients, collectives), or while a memory-measuring one warms up (compiles)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

FULL_COLLECTION_THRESHOLD = 1_000_000
"""Generation-1 collections before a full one (Python's default is 10): never, in a worker's life."""


def skip_full_collections() -> None:
    """Leave the oldest generation alone until the worker exits.

    After the imports a worker holds ~500k objects, and torch.compile creates enough long-lived
    ones to trigger a full collection ~9 times per compiled case, each walking everything
    (~0.3 s): ~3 s per rank, ~10% of a 4-rank launch on 2 cores. The young generations are still
    collected, so what a case drops is mostly freed as before; the cyclic garbage that would have
    reached the oldest one (a few hundred thousand small objects) stays until exit. The worker
    that measures memory (memory_fidelity.py) keeps the default collector for the steps it
    measures (`full_collections_skipped` around its warm-up only).
    """
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_THRESHOLD)


@contextmanager
def full_collections_skipped() -> Iterator[None]:
    """`skip_full_collections` for the block only (a warm-up step, its compilation included); the
    collector's thresholds are back as they were for whatever is measured after it."""
    before = gc.get_threshold()
    skip_full_collections()
    try:
        yield
    finally:
        gc.set_threshold(*before)
