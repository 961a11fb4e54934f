"""The committed corpus fit (planner/cost/parameters.py `CORPUS_FIT`) is what fitting the corpus gives.

A change to the cost model or to the corpus that moves the fit fails here until the constants are
refitted (`fsdp-planner fidelity --write` prints the new fit), so that the uncalibrated model never
silently drifts from the measured runs it was fitted to. The fit reads the fit split only: a held-out
source that reaches it fails here (issue 37), and the split itself is held to the issue's rule.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from planner.catalog.gpus import resolve_gpu
from planner.cost.parameters import CORPUS_FIT, power_density, power_limited_clock
from planner.fidelity.fit import (
    Prices,
    SourceRun,
    chip_densities,
    corpus_runs,
    density_share,
    fit_corpus,
    fit_split,
    fitted_chips,
    leave_one_source_out,
    price,
)
from planner.fidelity.report import HELD_OUT_MIN_PRICED_RUNS, HELD_OUT_SOURCE_SHARE
from planner.fidelity.schema import load_corpus
from planner.fidelity.split import HeldOutSourceError, fit_sources, split_of


class _Spy(Prices):
    """Prices that remember every source they were asked to price."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: set[str] = set()

    def __call__(self, item: SourceRun, fit):  # type: ignore[no-untyped-def]
        self.sources.add(item.source)
        return super().__call__(item, fit)


def test_the_committed_fit_is_the_fit_splits_fit_and_reads_no_held_out_run() -> None:
    spy = _Spy()
    fitted = fit_corpus(fit_split(corpus_runs(load_corpus())), prices=spy)
    assert asdict(fitted) == asdict(CORPUS_FIT), (
        f"the fit split now fits {fitted}; put it in planner/cost/parameters.py CORPUS_FIT "
        "(and run `fsdp-planner fidelity --write`)"
    )
    assert spy.sources and all(split_of(source) == "fit" for source in spy.sources), spy.sources


@pytest.mark.parametrize("fit", [
    lambda runs: fit_corpus(runs, rounds=1),
    lambda runs: leave_one_source_out(runs, CORPUS_FIT),
])
def test_a_fit_handed_a_held_out_source_refuses_it(fit) -> None:  # type: ignore[no-untyped-def]
    runs = corpus_runs(load_corpus())
    held_out = next(item for item in runs if split_of(item.source) == "held-out")
    with pytest.raises(HeldOutSourceError, match=held_out.source):
        fit([*fit_split(runs)[:3], held_out])


def test_the_split_holds_out_a_third_of_the_sources_from_other_trainers_than_torchtitan() -> None:
    """Issue 37's rule: a third of the sources, at least 25 priced runs, from trainers other than
    torchtitan. A torchtitan source may be held out beyond that (a GPU no fit has read, such as the
    MI300X), but it does not count towards the third."""
    corpus = load_corpus()
    ids = {f.source.id for f in corpus}
    assert fit_sources() <= ids, f"split.json names sources the corpus lacks: {sorted(fit_sources() - ids)}"
    held_out = [
        f for f in corpus
        if split_of(f.source.id) == "held-out"
        and not any("torchtitan" in run.config.engine for run in f.runs)
    ]
    assert len(held_out) >= HELD_OUT_SOURCE_SHARE * len(corpus), [f.source.id for f in held_out]
    runs = [run for f in held_out for run in f.runs]
    priced = [run for run in runs if run.priceable and run.throughput_comparable]
    assert len(priced) >= HELD_OUT_MIN_PRICED_RUNS, len(priced)


def test_chips_with_enough_runs_get_a_share_of_their_own() -> None:
    runs = fit_split(corpus_runs(load_corpus()))
    assert fitted_chips(runs) == sorted(CORPUS_FIT.matmul_share_by_chip)
    assert {"GA100", "GH100"} <= set(fitted_chips(runs))


def test_a_share_moves_the_predictions_the_way_it_says() -> None:
    runs = [item for item in corpus_runs(load_corpus()) if item.run.hardware.gpu == "A100-80GB"][:3]
    base = {item.run.id: r.predicted_tokens_per_s_per_gpu for item, r in price(runs, CORPUS_FIT)}
    faster = replace(CORPUS_FIT, matmul_share_by_chip={**CORPUS_FIT.matmul_share_by_chip, "GA100": 1.0})
    for item, result in price(runs, faster):
        assert result.predicted_tokens_per_s_per_gpu > base[item.run.id]


@pytest.mark.parametrize(
    ("board", "limit", "clock"),
    [(700, None, 1.0), (700, 700, 1.0), (700, 900, 1.0), (None, 500, 1.0), (700, 500, 0.863)],
)
def test_a_power_cap_slows_the_clock_by_the_cube_root_of_the_dynamic_power_left(
    board: float | None, limit: float | None, clock: float
) -> None:
    assert power_limited_clock(board, limit) == pytest.approx(clock, abs=1e-3)


def test_a_chip_without_a_fit_of_its_own_takes_the_power_density_law_through_the_fitted_ones() -> None:
    """A training step holds the GPU at its board power: the more dense TFLOP/s each watt must carry,
    the lower the clock it sustains (as the cube root, `power_limited_clock`'s law). The law through
    the fitted chips' mean reproduces each fitted chip's own share within 2% (A100 at 0.78 TFLOP/s per
    watt, H100 and H200 at 1.41), and prices the chips no fit has by their datasheets alone."""
    densities = chip_densities(fit_split(corpus_runs(load_corpus())))
    assert densities == pytest.approx({"GA100": 0.78, "GH100": 1.413}, abs=1e-3)
    assert CORPUS_FIT.matmul_share == pytest.approx(
        density_share(CORPUS_FIT.matmul_share_by_chip, densities), abs=5e-4
    )
    for chip, share in CORPUS_FIT.matmul_share_by_chip.items():
        law = CORPUS_FIT.matmul_share / densities[chip] ** (1 / 3)
        assert law == pytest.approx(share, rel=0.02), (chip, law, share)
    names = ("GB200", "GB300", "B200", "MI300X", "MI325X")
    share = {name: CORPUS_FIT.matmul_share_for(resolve_gpu(name)) for name in names}
    assert power_density(resolve_gpu("B200")) == pytest.approx(2.25)
    assert share["GB300"] > share["GB200"]  # the same peak at 1,400 W against 1,200 W
    assert share["MI325X"] > share["MI300X"]  # the same die at 1,000 W against 750 W
    assert share["B200"] < CORPUS_FIT.matmul_share_by_chip["GH100"]  # 2.25 TFLOP/s per watt against 1.41
    unstated = resolve_gpu("H100").model_copy(update={"name": "mine", "chip": None, "board_power_w": None})
    assert CORPUS_FIT.matmul_share_for(unstated) == CORPUS_FIT.matmul_share
