// Injected into every JupyterLab page the browser tests open (see lab_page.py): small read-only
// queries on the notebook panel and its DOM, plus Run All through the application's command.
window.playbookTest = {
  panel(name) {
    const app = window.jupyterapp;
    if (!app || !app.shell) return null;
    return Array.from(app.shell.widgets("main")).find((w) => w.context && w.context.path === name) || null;
  },
  async kernelReady(name) {
    const p = this.panel(name);
    await p.context.ready;
    await p.sessionContext.ready;
    return true;
  },
  kernelStatus(name) {
    const s = this.panel(name).sessionContext.session;
    return s && s.kernel ? s.kernel.status : "none";
  },
  kernelId(name) {
    const p = this.panel(name);
    const s = p && p.sessionContext.session;
    return s && s.kernel ? s.kernel.id : null;
  },
  cells(name) {
    // [index, cell widget] for every cell; tags each cell's node so Playwright can find it
    const cells = Array.from(this.panel(name).content.widgets);
    cells.forEach((c, i) => c.node.setAttribute("data-playbook-cell", `${name}:${i}`));
    return cells.map((c, i) => [i, c]);
  },
  codeCells(name) {
    return this.cells(name).filter(([, c]) => c.model.type === "code");
  },
  runAll(name) {
    const p = this.panel(name);
    window.jupyterapp.shell.activateById(p.id);
    this.finishedPolls = 0;
    window.jupyterapp.commands.execute("notebook:run-all-cells"); // not awaited: runFinished polls
    return true;
  },
  runFinished(name) {
    // true once no cell is queued or running for two polls in a row, or a dialog asks something
    if (document.querySelector(".jp-Dialog")) return true;
    const code = this.codeCells(name);
    const pending = code.filter(
      ([, c]) => c.model.executionState === "running" || (c.promptNode && c.promptNode.textContent.includes("*"))
    ).length;
    const ran = code.filter(([, c]) => c.model.executionCount !== null).length;
    const idle = this.kernelStatus(name) === "idle";
    this.finishedPolls = pending === 0 && ran > 0 && idle ? this.finishedPolls + 1 : 0;
    return this.finishedPolls >= 2;
  },
  outputNode(cell) {
    return cell.node.querySelector(".jp-OutputArea");
  },
  widgetProblems(name) {
    const found = [];
    for (const [i, c] of this.codeCells(name)) {
      const out = this.outputNode(c);
      if (!out) continue;
      for (const line of out.innerText.split("\n")) {
        if (line.includes("Error displaying widget") || line.includes("Loading widget")) found.push(`cell ${i}: ${line.trim()}`);
      }
    }
    return found;
  },
  emptyFigures(name) {
    // plotly figures that draw axes but no trace: data that never arrived (a diagram made of shapes
    // alone hides its axes, so it is not counted)
    const found = [];
    for (const [i, c] of this.codeCells(name)) {
      for (const el of c.node.querySelectorAll(".js-plotly-plot")) {
        if (!(el.data || []).length && el.querySelector(".xtick, .ytick")) {
          const title = ((el.layout || {}).title || {}).text || "untitled";
          found.push(`cell ${i}: a figure with axes and no data ("${title}")`);
        }
      }
    }
    return found;
  },
  plotCount() {
    return document.querySelectorAll(".js-plotly-plot").length;
  },
  visualCells(name) {
    return this.codeCells(name)
      .filter(([, c]) => {
        const out = this.outputNode(c);
        return out && out.querySelector(".jupyter-widgets, .js-plotly-plot");
      })
      .map(([i]) => i);
  },
  controls(name) {
    // every slider, dropdown, toggle-button row and checkbox, in page order
    const found = [];
    let id = 0;
    for (const [i, c] of this.codeCells(name)) {
      const out = this.outputNode(c);
      if (!out) continue;
      for (const el of out.querySelectorAll(".widget-slider, .widget-dropdown, .widget-toggle-buttons, .widget-checkbox")) {
        let kind, selected = 0, options = 0, atEnd = false;
        if (el.classList.contains("widget-slider")) {
          const h = el.querySelector(".noUi-handle");
          if (!h) continue;
          kind = "slider";
          atEnd = Number(h.getAttribute("aria-valuenow")) >= Number(h.getAttribute("aria-valuemax"));
        } else if (el.classList.contains("widget-dropdown")) {
          const s = el.querySelector("select");
          kind = "dropdown";
          selected = s.selectedIndex;
          options = s.options.length;
        } else if (el.classList.contains("widget-toggle-buttons")) {
          const b = Array.from(el.querySelectorAll("button"));
          kind = "toggle";
          selected = Math.max(0, b.findIndex((x) => x.classList.contains("mod-active")));
          options = b.length;
        } else {
          kind = "checkbox";
        }
        el.setAttribute("data-playbook-control", String(id));
        const disabled = this.isDisabled(el);
        found.push({
          id: id++, cell: i, kind, selected, options, at_end: atEnd,
          label: this.label(el), value: this.valueText(el),
          disabled, reason: disabled ? this.disabledReason(el, out) : "",
        });
      }
    }
    return found;
  },
  label(el) {
    // the description a learner reads (a checkbox has an empty label before the box and its text after)
    const texts = Array.from(el.querySelectorAll(".widget-label, .widget-label-basic"))
      .map((x) => x.innerText.replace(/\u200b/g, "").trim())
      .filter((t) => t);
    return texts.length ? texts[0] : "";
  },
  isDisabled(el) {
    return !!el.querySelector(":disabled, [disabled]") || el.hasAttribute("disabled");
  },
  valueText(el) {
    const s = el.querySelector("select");
    if (s) return s.value;
    const active = el.querySelector("button.mod-active");
    if (active) return active.innerText.trim();
    const box = el.querySelector("input[type=checkbox]");
    if (box) return String(box.checked);
    const readout = el.querySelector(".widget-readout");
    return readout ? readout.innerText.trim() : "";
  },
  disabledReason(el, out) {
    // a tooltip on the control that says more than its own label, or text in the cell's output naming it
    const own = this.label(el);
    const tips = [el, ...el.querySelectorAll("[title]")].map((x) => (x.getAttribute("title") || "").trim());
    const tip = tips.find((t) => t && t !== "null" && t !== own && !el.innerText.includes(t));
    if (tip) return tip;
    if (!own) return "";
    const rest = out.innerText.split("\n").filter((line) => line.includes(own) && !el.innerText.includes(line.trim()));
    return rest.length ? rest[0].trim() : "";
  },
  watch(name, index) {
    // from now on, note when the cell's output area last changed in the DOM (a redraw, a new output)
    // and how often the kernel went busy (the control's message being handled): see settled()
    this.unwatch();
    const kernel = this.panel(name).sessionContext.session.kernel;
    const w = { busy: 0, last: performance.now() };
    const onStatus = (_, status) => {
      w.last = performance.now();
      if (status === "busy") w.busy++;
    };
    kernel.statusChanged.connect(onStatus);
    const observer = new MutationObserver(() => (w.last = performance.now()));
    observer.observe(this.outputNode(this.cells(name)[index][1]), {
      subtree: true, childList: true, attributes: true, characterData: true,
    });
    w.stop = () => {
      kernel.statusChanged.disconnect(onStatus);
      observer.disconnect();
    };
    this.watching = w;
    return true;
  },
  unwatch() {
    if (this.watching) this.watching.stop();
    this.watching = null;
  },
  settled(name, quietMs) {
    // the kernel has handled a message since watch(), is idle, and neither it nor the cell's output
    // area has changed for quietMs (plotly redraws as the update's messages arrive, then goes quiet)
    const w = this.watching;
    return !!w && w.busy > 0 && this.kernelStatus(name) === "idle" && performance.now() - w.last >= quietMs;
  },
  figures(name, index) {
    const cell = this.cells(name)[index][1];
    // what the figure shows, less what plotly writes into it itself (private keys, a fresh uid per
    // trace object, the x/y type it infers for a heatmap, the autosize flag its widget sets when it sizes)
    // and what plotly.js computes for an axis: an autoranged or scale-constrained axis's range (it
    // depends on the order of redraws), and the default domain [0, 1] it writes in on the first redraw
    const own = new Set(["uid", "xtype", "ytype", "autosize"]);
    return JSON.stringify(
      Array.from(cell.node.querySelectorAll(".js-plotly-plot")).map((el) => {
        const constrained = JSON.stringify(el.layout || {}).includes('"scaleanchor"');
        return JSON.parse(
          JSON.stringify({ data: el.data, layout: el.layout }, function (k, v) {
            if (k.startsWith("_") || own.has(k)) return undefined;
            if (k === "range" && (constrained || this.autorange === true)) return undefined;
            if (k === "domain" && (v == null || JSON.stringify(v) === "[0,1]")) return undefined;
            // an axis plotly.js wrote in itself, holding nothing but its computed autorange
            if (/^[xy]axis\d*$/.test(k) && v && Object.keys(v).every((x) => x === "range" || x === "autorange") && v.autorange !== "reversed")
              return undefined;
            return v;
          })
        );
      })
    );
  },
};
