"""The plan page's alternatives chart in a real browser (Debian's chromium, headless): the chosen
plan's marker is a ring, so the point drawn at the same place (the chosen configuration on the Pareto
front, an alternative priced alike) shows through it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import CHEAP_PLAN
from tests.dashboard.conftest import BrowserPage, LiveServer
from tests.dashboard.test_browser import chart_marks

pytestmark = pytest.mark.browser

CHOSEN_MARKERS = """(id) => {
  const plot = document.getElementById(id);
  const found = [];
  plot.querySelectorAll(".scatterlayer g.trace").forEach((group) => {
    const trace = group.__data__ && group.__data__[0] && group.__data__[0].trace;
    const classes = ((trace && trace.meta && trace.meta.class) || "").split(" ");
    group.querySelectorAll("path.point").forEach((mark) => {
      const box = mark.getBoundingClientRect();
      const style = getComputedStyle(mark);
      found.push({classes, x: box.x + box.width / 2, y: box.y + box.height / 2, width: box.width,
                  fill: style.fill, fillOpacity: style.fillOpacity});
    });
  });
  return found;
}"""


def test_the_chosen_point_leaves_the_points_under_it_visible(
    live_server: LiveServer, page: BrowserPage
) -> None:
    p = page.page
    created = p.request.post(f"{live_server.url}/api/v1/plans", data=CHEAP_PLAN)
    assert created.ok, created.text()
    plan_id = created.json()["id"]
    p.goto(f"{live_server.url}/plans/{plan_id}")
    assert chart_marks(p, "tradeoff", "circle", "chosen") == 1
    markers: list[dict[str, Any]] = p.evaluate(CHOSEN_MARKERS, "plot-tradeoff")
    [chosen] = [m for m in markers if "chosen" in m["classes"]]
    # A ring: nothing painted inside it.
    assert chosen["fill"] == "none" or float(chosen["fillOpacity"]) == 0, chosen
    # The chosen configuration is on the Pareto front: its point there is drawn, under the ring.
    under = [m for m in markers if "pareto" in m["classes"]
             and abs(m["x"] - chosen["x"]) < 2 and abs(m["y"] - chosen["y"]) < 2]
    assert under and under[0]["width"] > 0, markers
    assert under[0]["width"] < chosen["width"]  # inside the ring, not covering it
    page.screenshot("tradeoff-chosen-ring")


def test_each_launcher_button_downloads_a_file_of_its_own(live_server: LiveServer, page: BrowserPage) -> None:
    """Downloaded one after another, the targets' bundles no longer land on one name (the browser
    renamed them `... (1).tar.gz`, or the second replaced the first)."""
    p = page.page
    created = p.request.post(f"{live_server.url}/api/v1/plans", data=CHEAP_PLAN)
    assert created.ok, created.text()
    p.goto(f"{live_server.url}/plans/{created.json()['id']}")
    names = {}
    for target in ("torchrun", "slurm", "k8s", "skypilot"):
        with p.expect_download() as download:
            p.click(f"#download-launcher-{target}")
        names[target] = download.value.suggested_filename
    assert len(set(names.values())) == 4, names
    assert all(name.endswith(f"-{target}.tar.gz") for target, name in names.items()), names
