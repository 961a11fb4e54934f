"""A limit on the CPU time of one plan's work: the search, and the advice its refusals carry.

CPU time, not wall-clock, so that whether a request fits the limit does not depend on the load. One
deadline covers everything a request does (the search's pre-check and its advice, then the pricing),
so a caller's limit per plan bounds the whole of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import process_time


@dataclass(frozen=True, slots=True)
class CpuDeadline:
    """`limit_s` seconds of this process's CPU time from when it was made (`after`)."""

    limit_s: float
    at: float
    """process_time() past which the work stops."""

    @classmethod
    def after(cls, limit_s: float) -> CpuDeadline:
        return cls(limit_s=limit_s, at=process_time() + limit_s)

    def passed(self) -> bool:
        return process_time() > self.at
