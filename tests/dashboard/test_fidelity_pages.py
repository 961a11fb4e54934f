"""The accuracy page's "Published and measured runs" section: the stored fidelity report, drawn."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient
from markupsafe import escape

from planner.fidelity.report import stored_report
from tests.dashboard.figures import figure_html, marks, plot, traces


def test_the_accuracy_page_shows_the_corpus_even_without_validation_runs(client: TestClient) -> None:
    report = stored_report()
    page = client.get("/accuracy")
    assert page.status_code == 200
    text = page.text
    assert 'id="empty-accuracy"' in text  # the validation-run part is unchanged
    assert '<h2 id="corpus-title">Published and measured runs</h2>' in text

    # The scatter: one series per GPU type, a point per priced run that publishes tokens/s, on log axes.
    figure = plot(text, "corpus-throughput")
    # (A run whose tokens/s the corpus does not price is named under the chart instead.)
    plotted = [r for r in report.runs if r.priced and r.throughput_error is not None
               and r.measured_tokens_per_s_per_gpu is not None
               and r.predicted_tokens_per_s_per_gpu is not None]
    assert marks(text, "corpus-throughput", "circle") == len(plotted) > 0
    assert sorted(t["name"] for t in traces(figure) if "guide" not in t["meta"]["class"]) == sorted(
        {r.gpu for r in plotted})
    assert figure["layout"]["xaxis"]["type"] == figure["layout"]["yaxis"]["type"] == "log"
    assert [t["name"] for t in traces(figure, "guide")] == ["y = x (perfect prediction)"]
    assert len(re.findall(r"<tr><td>", figure_html(text, "corpus-throughput"))) == len(plotted)  # data table

    # The targets, each met or missed.
    targets = re.search(r'<table class="data" id="corpus-targets">(.*?)</table>', text, re.S)
    assert targets
    for target in report.targets:
        assert escape(target.name) in targets.group(1)
    assert targets.group(1).count("badge-met") == sum(t.met for t in report.targets)
    assert targets.group(1).count("badge-missed") == sum(not t.met for t in report.targets)

    # The summaries, and every run (the unpriced ones with their reason).
    for table in ("corpus-by-gpu", "corpus-by-source", "corpus-by-quantity"):
        assert f'id="{table}"' in text
    runs = re.search(r'<table class="data cards" id="corpus-runs">(.*?)</table>', text, re.S)
    assert runs and runs.group(1).count("<tr") == len(report.runs) + 1  # + the header
    for r in report.runs:
        if not r.priced:
            assert f"not priced: {escape(r.reason or '')}" in runs.group(1)


def test_every_priced_run_shows_its_80_percent_interval(client: TestClient) -> None:
    # The report's intervals (a held-out run's calibrated without its source) under each prediction,
    # marked where the measurement fell outside, and as error bars on the scatter.
    report = stored_report()
    text = client.get("/accuracy").text
    runs = re.search(r'<table class="data cards" id="corpus-runs">(.*?)</table>', text, re.S)
    assert runs
    with_interval = [r for r in report.runs if r.priced and (r.throughput_interval or r.memory_interval)]
    assert with_interval
    shown = runs.group(1).count('<span class="interval">')
    assert shown == sum((r.throughput_interval is not None) + (r.memory_interval is not None)
                        for r in with_interval)
    outside = sum((r.throughput_covered is False) + (r.memory_covered is False) for r in with_interval)
    assert runs.group(1).count("(measured outside)") == outside
    tokens = next(r for r in report.runs if r.throughput_interval and r.measured_tokens_per_s_per_gpu)
    low, high = tokens.throughput_interval
    assert f"{low:,.0f}–{high:,.0f}" in runs.group(1)
    bars = [t["error_x"] for t in traces(plot(text, "corpus-throughput")) if "error_x" in t]
    assert bars and all(min(b["array"]) >= 0 and min(b["arrayminus"]) >= 0 for b in bars)
