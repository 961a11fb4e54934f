"""Shapes a stored what-if study for its dashboard pages: the picks, the rows, the inputs."""

from __future__ import annotations

from dataclasses import dataclass

from api.dashboard import charts
from api.dashboard.formatting import days, percent, thousands
from api.dashboard.plan_views import Row
from api.schemas.studies import StudyDetail, StudyPointOut
from planner.formatting import money, network_bandwidth, quantity
from planner.study import StudyRequest


@dataclass(frozen=True)
class Pick:
    """A headline card: which cluster the study recommends for what."""

    key: str
    title: str
    point: StudyPointOut


def picks(study: StudyDetail) -> list[Pick]:
    """Cheapest within the deadline (when one was given), cheapest, fastest: one card per cluster."""
    chosen: list[Pick] = []
    days_ = study.deadline_days
    deadline = f"{days_:g} day{'' if days_ == 1 else 's'}" if days_ else ""
    for key, title, position in (
        ("deadline", f"Cheapest within {deadline}", study.cheapest_within_deadline if deadline else None),
        ("cheapest", "Cheapest", study.cheapest),
        ("fastest", "Fastest", study.fastest),
    ):
        if position is None:
            continue
        same = next((pick for pick in chosen if pick.point.position == position), None)
        if same is not None:  # one card says both
            chosen[chosen.index(same)] = Pick(same.key, f"{same.title}; {title.lower()} overall", same.point)
            continue
        chosen.append(Pick(key=key, title=title, point=study.points[position]))
    return chosen


def fitting_by_cost(study: StudyDetail) -> list[StudyPointOut]:
    """The clusters that can train the model, cheapest first (ties: sooner, then fewer GPUs)."""
    return sorted((p for p in study.points if p.fits),
                  key=lambda p: (p.cost or 0.0, p.days or 0.0, p.num_gpus, p.position))


def marks(study: StudyDetail, point: StudyPointOut) -> list[str]:
    """What the study says of a cluster, in words (the table's last column)."""
    words = []
    if point.position == study.cheapest_within_deadline:
        words.append("cheapest within the deadline")
    if point.position == study.cheapest:
        words.append("cheapest")
    if point.position == study.fastest:
        words.append("fastest")
    if point.pareto:
        words.append("Pareto front")
    if point.within_deadline is False:
        words.append("misses the deadline")
    return words


def input_rows(study: StudyDetail) -> list[Row]:
    """The study's inputs as labelled rows (the definitions macro)."""
    request = StudyRequest.model_validate(study.request)
    batch = (f"{thousands(request.global_batch_tokens)} tokens per step on every cluster"
             if request.batch_rule == "fixed"
             else f"{thousands(request.batch_tokens_per_gpu)} tokens per step per GPU (grows with the "
                  "cluster)")
    search = request.search.model_dump(exclude_defaults=True)
    stated = request.inter_node_bandwidth_gbps
    network = (
        Row("Network between nodes", network_bandwidth(stated), "stated by the study") if stated is not None
        else Row("Network between nodes", "each GPU type's catalog NIC",
                 "not stated: each plan's tokens/s interval spans the networks such clusters have")
    )
    return [
        Row("Model", request.model.name),
        Row("Token budget", f"{thousands(request.token_budget)} ({quantity(request.token_budget)})"),
        Row("Sequence length", thousands(request.seq_len)),
        Row("Batch", batch),
        Row("Precision / optimizer", f"{request.precision} / {request.optimizer}"),
        Row("GPU types and prices", ", ".join(
            f"{gpu.series} ${gpu.price:g}/GPU-hour"
            + (f" (calibration profile #{gpu.calibration_id})" if gpu.calibration_id else "")
            for gpu in request.gpus
        ), "calibrated where a profile is named; catalog peaks otherwise"),
        Row("Cluster sizes", ", ".join(str(size) for size in request.sizes()) + " GPUs"),
        network,
        Row("Deadline", f"{request.deadline_days:g} days" if request.deadline_days else "none"),
        Row("Search restrictions",
            "; ".join(f"{k}: {v}" for k, v in search.items()) if search else "none (everything searched)"),
    ]


def point_tooltip(point: StudyPointOut) -> str:
    """What hovering a cluster's point says: the cluster, the configuration, the numbers (with their
    80% intervals where the plan has them)."""
    days_, cost = point.days_interval, point.cost_interval
    return (f"{point.cluster} ({point.num_gpus} GPUs): {point.config_label}; {point.days:,.1f} days"
            + (f" ({days_.level:.0%}: {days_.low:,.1f}–{days_.high:,.1f})" if days_ else "")
            + f", {money(point.cost or 0.0)}"
            + (f" ({money(cost.low)}–{money(cost.high)})" if cost else "")
            + f", {thousands(point.tokens_per_s)} tokens/s, MFU {percent(point.mfu or 0.0)}")


def _point(point: StudyPointOut, prefix: str = "", *, bars: bool = True) -> charts.Point:
    """A cluster on the chart: hover says what it is, a click opens its plan (when it is still stored);
    with `bars`, the 80% intervals of its days and cost (drawn once: the GPU type's series has them)."""
    assert point.days is not None and point.cost is not None
    href = f"/plans/{point.plan_id}" if point.plan_id is not None else None
    return charts.Point(point.days, point.cost, prefix + point_tooltip(point), href=href,
                        x_range=point.days_interval if bars else None,
                        y_range=point.cost_interval if bars else None)


def chart(study: StudyDetail) -> charts.Chart | None:
    """Days to train against cost: one series per GPU type, the Pareto front as a line, the deadline."""
    fitting = [p for p in study.points if p.fits and p.days is not None and p.cost is not None]
    if not fitting:
        return None
    gpus = list(dict.fromkeys(p.series for p in fitting))
    series = [
        charts.Series(gpu, [_point(p) for p in fitting if p.series == gpu],
                      charts.PALETTE[i % len(charts.PALETTE)], css_class="cluster")
        for i, gpu in enumerate(gpus)
    ]
    front = [_point(p, "Pareto front: ", bars=False) for p in fitting if p.pareto]
    series.append(charts.Series("Pareto front", front, "#333333", markers=False, line=True,
                                css_class="pareto"))
    if study.cheapest_within_deadline is not None:
        pick = _point(study.points[study.cheapest_within_deadline], "recommended: ", bars=False)
        series.append(charts.Series("cheapest within the deadline", [pick], charts.HIGHLIGHT_COLOR, radius=7,
                                    css_class="chosen"))
    durations = [p.days for p in fitting]
    costs = [p.cost for p in fitting]
    guides = [charts.GuideLine(label=f"deadline {study.deadline_days:g} days", x=study.deadline_days)] \
        if study.deadline_days else []
    return charts.xy_chart(
        chart_id="study-chart", title="Days to train vs cost", series=series,
        x_label="days to train", y_label="cost (USD)", x_format=days, y_format=money,
        x_log=charts.should_use_log(durations), y_log=charts.should_use_log(costs), guides=guides,
    )


