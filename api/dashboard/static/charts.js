// fsdp-planner dashboard: draws each chart's figure (a JSON data island beside it) with plotly.js.
// Without JavaScript, or before this runs, every chart's numbers are in the table under it.
"use strict";

function drawCharts() {
  if (typeof window.Plotly === "undefined") return;
  document.querySelectorAll("script.plot-figure").forEach((island) => {
    const target = document.getElementById(island.dataset.plot);
    if (!target) return;
    const figure = JSON.parse(island.textContent);
    const config = { responsive: true, displayModeBar: false, displaylogo: false, scrollZoom: false };
    window.Plotly.newPlot(target, figure.data, figure.layout, config).then(() => {
      target.closest("figure").classList.add("plotted");
    });
    // A point that names a page of this site (a plan) opens it.
    target.on("plotly_click", (event) => {
      const point = event.points && event.points[0];
      const href = point && point.customdata;
      if (typeof href === "string" && href.startsWith("/") && !href.startsWith("//")) {
        window.location.assign(href);
      }
    });
  });
}

document.addEventListener("DOMContentLoaded", drawCharts);
