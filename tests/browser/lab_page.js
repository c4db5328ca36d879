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
  layout() {
    // the window and the left sidebar as a learner has them: the viewport's width, and whether the
    // file browser is open there (and how wide)
    const shell = window.jupyterapp.shell, fb = document.getElementById("filebrowser");
    const open = !shell.leftCollapsed && !!fb && fb.offsetParent !== null;
    return { width: window.innerWidth, fileBrowser: open ? Math.round(fb.getBoundingClientRect().width) : 0 };
  },
  async openFileBrowser() {
    await window.jupyterapp.commands.execute("filebrowser:activate");
    return this.layout();
  },
  unsizedPlots() {
    // figures plotly has not yet fitted to their cell (it draws at 700 px first, then resizes to its
    // container): checked before layoutProblems so that a figure is judged at the width it settles at
    return Array.from(document.querySelectorAll(".js-plotly-plot")).filter((gd) => {
      const full = gd._fullLayout;
      if (!full || !(gd.layout || {}).autosize && (gd.layout || {}).width) return false;
      return Math.abs(full.width - gd.clientWidth) > 1;
    }).length;
  },
  layoutProblems(name) {
    // what a learner cannot read at this width, per cell: an output wider than its cell (it scrolls
    // sideways), a row of a text table that wraps, a control whose text is clipped, and for each
    // plotly figure a title, legend or annotation outside it, a table showing fewer rows than its
    // data holds or a header wider than its column (see figureProblems)
    const found = new Set();
    for (const [i, c] of this.codeCells(name)) {
      const out = this.outputNode(c);
      if (!out) continue;
      const say = (what) => found.add(`cell ${i}: ${what}`);
      for (const o of out.querySelectorAll(".jp-OutputArea-output")) {
        if (o.scrollWidth > o.clientWidth + 1) say(`an output ${o.scrollWidth} px wide in ${o.clientWidth} px: it scrolls sideways`);
        for (const pre of o.querySelectorAll("pre")) this.wrappedRows(pre).forEach(say);
        const edge = o.getBoundingClientRect().right;
        for (const el of o.querySelectorAll(".widget-label, .widget-readout, .widget-toggle-button, .widget-dropdown select")) {
          if (!el.offsetParent) continue;
          const text = (el.innerText || el.value || "").trim();
          if (el.scrollWidth > el.clientWidth + 1) say(`control text clipped: "${text}" needs ${el.scrollWidth} px, has ${el.clientWidth}`);
          else if (el.getBoundingClientRect().right > edge + 1) say(`a control past the cell's right edge: "${text}"`);
        }
        for (const box of o.querySelectorAll(".widget-box"))
          if (box.offsetParent && box.scrollWidth > box.clientWidth + 1 && getComputedStyle(box).overflowX !== "visible")
            say(`a row of controls ${box.scrollWidth} px wide in ${box.clientWidth} px: the rest is cut off or scrolls`);
        const room = o.getBoundingClientRect(); // a plotly mimetype output is itself the figure's node
        for (const gd of [o, ...o.querySelectorAll(".js-plotly-plot")].filter((e) => e.classList.contains("js-plotly-plot")))
          this.figureProblems(gd, room).forEach(say);
      }
    }
    return Array.from(found);
  },
  wrappedRows(pre) {
    // lines laid out in columns (a run of spaces between words, or a bar) wider than the output: the
    // output wraps each such row in two, and the table can no longer be read down its columns
    const style = getComputedStyle(pre);
    const ctx = (this.canvas = this.canvas || document.createElement("canvas")).getContext("2d");
    ctx.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    const room = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    // (a "|" alone is no column: |x| is notation, and a one-line report is no table)
    const rows = pre.textContent.split("\n").filter((l) => /\S {2,}\S|│/.test(l.trim()));
    if (rows.length < 2) return [];
    const wide = rows.filter((l) => ctx.measureText(l).width > room + 1);
    if (!wide.length) return [];
    const px = Math.ceil(ctx.measureText(wide[0]).width);
    return [`${wide.length} of ${rows.length} rows of a text table wrap (${px} px in ${Math.floor(room)}): "${wide[0].trim().slice(0, 50)}"`];
  },
  figureProblems(gd, room) {
    // one plotly figure: wider than its cell; its title, legend, axis titles or annotations
    // reaching outside it; a legend that scrolls; a table with rows below its bottom edge (or not
    // drawn at all) or a header or cell wider than its column
    const found = [], svg = gd.querySelector(".main-svg"), full = gd._fullLayout;
    if (!svg || !full) return found;
    const fig = svg.getBoundingClientRect();
    const raw = ((gd.layout || {}).title || {}).text || "";
    const what = `figure "${String(raw).replace(/<[^>]+>/g, "").trim().slice(0, 60) || "untitled"}"`;
    if (fig.right > room.right + 1) found.push(`${what}: ${Math.round(fig.width)} px wide, ${Math.round(fig.right - room.right)} px past its cell`);
    const cut = (r) => r.width > 0 && (r.left < fig.left - 1 || r.right > fig.right + 1 || r.top < fig.top - 1 || r.bottom > fig.bottom + 1);
    const parts = [[".gtitle", "its title"], [".legend", "its legend"], [".g-xtitle, .g-ytitle, [class*='-xtitle'], [class*='-ytitle']", "an axis title"], [".annotation", "an annotation"]];
    for (const [sel, part] of parts)
      for (const el of gd.querySelectorAll(sel)) {
        if (!cut(el.getBoundingClientRect())) continue;
        found.push(`${what}: ${part} is cut at the figure's edge ("${el.textContent.trim().slice(0, 50)}")`);
        break;
      }
    // labels drawn over one another: the title, the legend and the annotations (subplot titles,
    // a capacity line's label), each pair once (a diagram's many labels: the first 80)
    const labels = [[".gtitle", "its title"], [".legend", "its legend"], [".annotation", "an annotation"]]
      .flatMap(([sel, part]) => Array.from(gd.querySelectorAll(sel)).map((el) => [el, part, el.getBoundingClientRect()]))
      .filter(([, , r]) => r.width > 0 && r.height > 0)
      .slice(0, 80);
    const over = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 2 && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 2;
    overlaps: for (let i = 0; i < labels.length; i++)
      for (let j = i + 1; j < labels.length; j++)
        if (over(labels[i][2], labels[j][2])) {
          const name = ([el, part]) => `${part} ("${el.textContent.trim().slice(0, 30)}")`;
          found.push(`${what}: ${name(labels[i])} overlaps ${name(labels[j])}`);
          break overlaps;
        }
    const bar = gd.querySelector(".legend .scrollbar");
    if (bar && bar.getBoundingClientRect().height > 0) found.push(`${what}: its legend scrolls (entries hidden below its edge)`);
    (gd._fullData || []).filter((t) => t.type === "table").forEach((trace, k) => {
      const table = gd.querySelectorAll(".table")[k];
      if (!table) return;
      const rows = Math.max(0, ...trace.cells.values.map((col) => col.length));
      const bottom = fig.top + full._size.t + full._size.h * (1 - trace.domain.y[0]);
      const first = table.querySelector(".y-column");
      const shown = Array.from(first ? first.querySelectorAll(".column-block") : [])
        .filter((b) => b.id !== "header")
        .flatMap((b) => Array.from(b.querySelectorAll(".column-cell")))
        .filter((cell) => cell.getBoundingClientRect().bottom <= bottom + 1).length;
      if (shown < rows) found.push(`${what}: its table shows ${shown} of ${rows} rows (the rest below its edge)`);
      for (const cell of table.querySelectorAll(".column-cell")) {
        const box = cell.querySelector(".cell-rect"), text = cell.querySelector(".cell-text");
        if (box && text && text.getBoundingClientRect().width > box.getBoundingClientRect().width + 1) {
          found.push(`${what}: "${text.textContent.slice(0, 40)}" is wider than its table column`);
          break;
        }
      }
    });
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
