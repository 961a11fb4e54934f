"""The committed corpus fit (planner/cost/parameters.py `CORPUS_FIT`) is what fitting the corpus gives.

A change to the cost model or to the corpus that moves the fit fails here until the constants are
refitted (`fsdp-planner fidelity --write` prints the new fit), so that the uncalibrated model never
silently drifts from the measured runs it was fitted to.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from planner.cost.parameters import CORPUS_FIT, power_limited_clock
from planner.fidelity.fit import corpus_runs, fit_corpus, fitted_chips, price
from planner.fidelity.schema import load_corpus


def test_the_committed_fit_is_the_corpus_fit() -> None:
    fitted = fit_corpus(corpus_runs(load_corpus()))
    assert asdict(fitted) == asdict(CORPUS_FIT), (
        f"the corpus now fits {fitted}; put it in planner/cost/parameters.py CORPUS_FIT "
        "(and run `fsdp-planner fidelity --write`)"
    )


def test_chips_with_enough_runs_get_a_share_of_their_own() -> None:
    runs = corpus_runs(load_corpus())
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
