// The book's page script: draws every figure stored on the page (a <script type="application/json">
// right after its <div>) with the plotly.js loaded once for the whole book, then lets the static
// dashboards' controls pick their frame (see playbook/book/grid.py).
__COMPOSER__
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("div.playbook-plot").forEach(function (div) {
    var spec = JSON.parse(document.getElementById(div.id + "-json").textContent);
    Plotly.newPlot(div, spec.data, spec.layout, {responsive: true, displaylogo: false}).then(function (gd) {
      if (spec.frames && spec.frames.length) playbookGrid(gd, spec.frames);
    });
  });
});
