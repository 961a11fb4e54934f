"""The fidelity report the service serves: the stored one, read once, with its runs filtered on request.

Building the report prices every corpus run and refits the corpus shares once per source (about a
minute), which a web process must not do per request: it serves the report that
`fsdp-planner fidelity --write` stored in the planner package (a test keeps it in step with the code).
One implementation behind GET /api/v1/fidelity and the dashboard's accuracy page.
"""

from __future__ import annotations

from functools import cache

from planner.catalog.gpus import GPU_CATALOG
from planner.fidelity.report import FidelityReport, stored_report
from planner.fidelity.schema import load_corpus

KNOWN_GPUS = tuple(sorted(GPU_CATALOG))
"""What the `gpu` filter accepts: the catalog's GPU names (the names corpus runs are priced as)."""
KNOWN_SOURCES = tuple(sorted(f.source.id for f in load_corpus()))
"""What the `source` filter accepts: the corpus' source ids (its file names)."""


class UnknownFilterError(ValueError):
    """A filter value that names no GPU type or source; `parameter` is the query parameter."""

    def __init__(self, parameter: str, value: str, known: tuple[str, ...]) -> None:
        what = "a GPU type of the catalog" if parameter == "gpu" else "a source of the corpus"
        super().__init__(f"{value!r} is not {what}; known: {', '.join(known)}")
        self.parameter = parameter


@cache
def served_report() -> FidelityReport:
    """The stored report, read once per process (it changes only with a new release of the planner)."""
    return stored_report()


def filtered_report(gpu: str | None = None, source: str | None = None) -> FidelityReport:
    """The served report with only the runs on GPU type `gpu` and from source `source` (summaries and
    targets stay those of the whole corpus: they are what the filters are read against)."""
    for parameter, value, known in (("gpu", gpu, KNOWN_GPUS), ("source", source, KNOWN_SOURCES)):
        if value is not None and value not in known:
            raise UnknownFilterError(parameter, value, known)
    report = served_report()
    if gpu is None and source is None:
        return report
    runs = tuple(
        r for r in report.runs if (gpu is None or r.gpu == gpu) and (source is None or r.source == source)
    )
    return report.model_copy(update={"runs": runs})
