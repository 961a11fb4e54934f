"""What the browser laid out, read from the page: for the checks that a chart or a table is readable
(axis titles clear of the tick labels, charts as wide as their card, data inside the tick range, label
cells of a few lines), which server-side tests cannot see."""

from __future__ import annotations

from typing import Any

AXIS_TITLE_OVERLAPS = """(id) => {
  const plot = document.getElementById(id);
  const overlaps = [];
  for (const axis of ["x", "y"]) {
    plot.querySelectorAll(`.g-${axis}title text`).forEach((title) => {
      const t = title.getBoundingClientRect();
      plot.querySelectorAll(`.${axis}tick text`).forEach((tick) => {
        const b = tick.getBoundingClientRect();
        if (b.width === 0 || b.height === 0) return;
        if (t.left < b.right && b.left < t.right && t.top < b.bottom && b.top < t.bottom) {
          overlaps.push(`${axis} title "${title.textContent}" over tick "${tick.textContent}"`);
        }
      });
    });
  }
  return overlaps;
}"""

WIDTH_SHARE = """(id) => {
  const plot = document.getElementById(id);
  const card = plot.closest("figure");
  const style = getComputedStyle(card);
  const inner = card.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return plot.querySelector(".main-svg").getBoundingClientRect().width / inner;
}"""

TICK_EXTENT = """(id) => {
  // Centres of the labelled ticks, in page pixels: [left, right] of x, [top, bottom] of y.
  const plot = document.getElementById(id);
  const centres = (axis) => Array.from(plot.querySelectorAll(`.${axis}axislayer-above .${axis}tick text`))
    .map((text) => text.getBoundingClientRect())
    .filter((box) => box.width > 0)
    .map((box) => axis === "x" ? box.left + box.width / 2 : box.top + box.height / 2);
  const x = centres("x"), y = centres("y");
  return {x: [Math.min(...x), Math.max(...x)], y: [Math.min(...y), Math.max(...y)]};
}"""

TRACE_BOX = """({id, css}) => {
  // The page box around what the traces with `css` in meta.class drew (markers and lines).
  const plot = document.getElementById(id);
  const boxes = [];
  plot.querySelectorAll(".scatterlayer g.trace").forEach((group) => {
    const trace = group.__data__ && group.__data__[0] && group.__data__[0].trace;
    const classes = ((trace && trace.meta && trace.meta.class) || "").split(" ");
    if (!classes.includes(css)) return;
    group.querySelectorAll("path.js-line, path.point")
      .forEach((mark) => boxes.push(mark.getBoundingClientRect()));
  });
  if (!boxes.length) return null;
  return {left: Math.min(...boxes.map((b) => b.left)), right: Math.max(...boxes.map((b) => b.right)),
          top: Math.min(...boxes.map((b) => b.top)), bottom: Math.max(...boxes.map((b) => b.bottom))};
}"""

LINES = """(selector) => Array.from(document.querySelectorAll(selector)).map((cell) => {
  // Lines of text a cell wraps to: the distinct tops of its text's line boxes.
  const range = document.createRange();
  range.selectNodeContents(cell);
  const lines = Array.from(range.getClientRects()).filter((r) => r.width > 0);
  const tops = new Set(lines.map((r) => Math.round(r.top)));
  return [cell.textContent.trim(), tops.size];
})"""


def plotted(page: Any, chart: str) -> str:
    """Wait until plotly.js drew the chart; its plot element's id."""
    page.wait_for_selector(f'figure[data-chart="{chart}"].plotted', state="attached")
    return f"plot-{chart}"


def axis_title_overlaps(page: Any, chart: str) -> list[str]:
    """Each axis title that covers one of its axis' tick labels (bounding boxes of the SVG texts)."""
    return list(page.evaluate(AXIS_TITLE_OVERLAPS, plotted(page, chart)))


def width_share(page: Any, chart: str) -> float:
    """The drawn chart's width over its card's inner width."""
    return float(page.evaluate(WIDTH_SHARE, plotted(page, chart)))


def marks_inside_ticks(page: Any, chart: str, css_class: str) -> tuple[bool, dict[str, Any]]:
    """Whether what the `css_class` traces drew lies between the outermost labelled ticks on both axes
    (within a pixel or two: a marker's radius may reach past a tick drawn at its very value)."""
    plot = plotted(page, chart)
    ticks = page.evaluate(TICK_EXTENT, plot)
    box = page.evaluate(TRACE_BOX, {"id": plot, "css": css_class})
    assert box, f"nothing drawn for {css_class} in {chart}"
    slack = 8
    inside = (ticks["x"][0] <= box["left"] + slack and box["right"] - slack <= ticks["x"][1]
              and ticks["y"][0] <= box["top"] + slack and box["bottom"] - slack <= ticks["y"][1])
    return inside, {"ticks": ticks, "marks": box}


def wrapped_lines(page: Any, selector: str) -> list[tuple[str, int]]:
    """(text, lines) of every cell the selector finds."""
    return [(text, int(lines)) for text, lines in page.evaluate(LINES, selector)]
