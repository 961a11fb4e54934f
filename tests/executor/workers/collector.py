"""The garbage collector of the workers that compare numbers (losses, gradients, collectives), not
memory: no automatic full collections."""

from __future__ import annotations

import gc

FULL_COLLECTION_THRESHOLD = 1_000_000
"""Generation-1 collections before a full one (Python's default is 10): never, in a worker's life."""


def skip_full_collections() -> None:
    """Leave the oldest generation alone until the worker exits.

    After the imports a worker holds ~500k objects, and torch.compile creates enough long-lived
    ones to trigger a full collection ~9 times per compiled case, each walking everything
    (~0.3 s): ~3 s per rank, ~10% of a 4-rank launch on 2 cores. The young generations are still
    collected, so what a case drops is mostly freed as before; the cyclic garbage that would have
    reached the oldest one (a few hundred thousand small objects) stays until exit. The workers
    that measure memory (memory_fidelity.py) keep the default collector.
    """
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_THRESHOLD)
