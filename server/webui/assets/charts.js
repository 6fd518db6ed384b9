// uPlot wrappers: a Chart keeps one uPlot instance in a holder element (data-chart=<name>),
// redraws it with new data without losing the cursor, rebuilds it when its series change,
// and turns a drag on the plot into a zoom request (the page re-queries the server for that
// range, which downsamples it). Charts of one page share their cursor (sync key).
import { el, fmt } from './api.js';

export const PALETTE = ['#2456c8', '#d9480f', '#2b8a3e', '#862e9c', '#c2255c', '#0b7285',
                        '#e67700', '#5c940d', '#364fc7', '#a61e4d'];
export const SKIP_COLOUR = '#d62728';
export const DECISION_COLOUR = '#7b3fbf';

// A y axis in powers of two (loss scales, binades).
export const LOG2 = { distr: 3, log: 2 };
export const LOG10 = { distr: 3, log: 10 };
// Steps are whole numbers: the step axis ticks at 1, 2, 5, 10, 20, 50, ... steps apart, never at
// uPlot's fractional increments (0.2, 0.25, 0.5) on a run of a few steps.
export const STEP_INCRS = Array.from({ length: 16 }, (_, e) => [1, 2, 5].map((m) => m * 10 ** e)).flat();

// A linear y axis whose data are all 0 (a step time no trainer reported) spans 0..1, not
// uPlot's 0..100; anything else keeps uPlot's own padded range.
export const zeroSafeRange = (u, min, max) => {
  if (min == null || max == null) return [null, null];
  return min === 0 && max === 0 ? [0, 1] : uPlot.rangeNum(min, max, 0.1, true);
};

export const pow2Labels = (u, splits) => splits.map((v) => (v > 0 ? `2^${Math.round(Math.log2(v))}` : ''));
export const expLabels = (u, splits) => splits.map((v) => (v > 0 ? v.toExponential(0) : ''));

export class Chart {
  // spec: {name, title, height, series: [{label, stroke, dash, width, paths, points, scale}],
  //        scales, axes (the y axes), sync, onZoom(from|null, to|null), plugins (or a function of
  //        the holder returning them), xRange() -> [from, to] (the steps asked for, so that every
  //        chart of a page spans them even where a series has no point), noData}
  constructor(parent, spec) {
    this.spec = spec;
    this.holder = el('div', { class: 'chart', dataset: { chart: spec.name } });
    parent.append(el('div', { class: 'chart-title' }, spec.title), this.holder);
    this.uplot = null;
    this.signature = '';
    window.addEventListener('resize', () => this.uplot && this.uplot.setSize(this.size()));
  }

  size() {
    return { width: Math.max(300, this.holder.clientWidth), height: this.spec.height || 220 };
  }

  // data: [xs, ys...] aligned with series; every y series null-only -> the "no data" line.
  set(data, series = this.spec.series) {
    const empty = data.length < 2 || data[0].length === 0 ||
      data.slice(1).every((ys) => ys.every((y) => y === null || y === undefined));
    if (empty) {
      this.destroy();
      this.holder.replaceChildren(el('div', { class: 'nodata' }, this.spec.noData || 'no data in this range'));
      this.holder.dataset.empty = '1';
      return;
    }
    delete this.holder.dataset.empty;
    const signature = JSON.stringify(series.map((s) => [s.label, !!s.paths]));
    if (this.uplot && signature === this.signature) {
      this.uplot.setData(data);
      return;
    }
    this.destroy();
    this.holder.replaceChildren();
    this.signature = signature;
    this.uplot = new uPlot(this.options(series), data, this.holder);
    testHook().charts[this.spec.name] = this.uplot;
  }

  destroy() {
    if (this.uplot) this.uplot.destroy();
    this.uplot = null;
    this.signature = '';
  }

  options(series) {
    const spec = this.spec;
    const opts = {
      ...this.size(),
      cursor: {
        sync: spec.sync ? { key: spec.sync } : undefined,
        drag: { x: !!spec.onZoom, y: false, setScale: false },
      },
      legend: { live: true },
      scales: { x: { time: false, range: spec.xRange ? () => padRange(spec.xRange()) : undefined },
                y: { range: zeroSafeRange }, ...(spec.scales || {}) },
      axes: [{ label: 'step', incrs: STEP_INCRS }, ...(spec.axes || [{}])],
      series: [{ label: 'step', value: (u, v) => fmt(v) }, ...series.map((s) => ({
        spanGaps: false, width: 1.5, value: (u, v) => fmt(v), ...s,
      }))],
      plugins: typeof spec.plugins === 'function' ? spec.plugins(this.holder) : spec.plugins || [],
      hooks: {},
    };
    if (spec.onZoom) {
      opts.hooks.setSelect = [(u) => {
        if (u.select.width < 3) return;
        const from = Math.floor(u.posToVal(u.select.left, 'x'));
        const to = Math.ceil(u.posToVal(u.select.left + u.select.width, 'x'));
        u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
        spec.onZoom(from, to);
      }];
      opts.hooks.ready = [(u) => u.over.addEventListener('dblclick', () => spec.onZoom(null, null))];
    }
    return opts;
  }
}

const padRange = ([from, to]) => (to > from ? [from, to] : [from - 1, from + 1]);

// Series present at fewer than half of the steps (target counts come with full samples only:
// every sample_full_every steps and around events) are drawn as points, not as lines through
// steps nobody measured. data: uPlot.join's output (undefined where a series has no point).
export function sparseAsPoints(series, data, steps) {
  series.forEach((s, i) => {
    const present = data[i + 1].filter((y) => y !== undefined).length;
    if (present < steps / 2) Object.assign(s, { paths: () => null, points: { show: true, size: 6, fill: s.stroke } });
  });
  return series;
}

// What the browser test reads back: each chart's uPlot instance by name (valToPos tells where a
// step is drawn) and the tensor page's heatmap geometry.
export function testHook() {
  window.ampscope = window.ampscope || { charts: {}, heatmap: null };
  return window.ampscope;
}

// A tooltip box inside a chart holder, placed next to the cursor.
export function tooltip(holder) {
  const tip = el('div', { class: 'tip', hidden: true });
  holder.append(tip);
  return {
    show(u, left, top, content) {
      const over = u.over.getBoundingClientRect();
      const box = holder.getBoundingClientRect();
      tip.replaceChildren(...content);
      tip.hidden = false;
      const x = over.left - box.left + left + 14;
      tip.style.left = `${Math.min(x, box.width - 300)}px`;
      tip.style.top = `${over.top - box.top + top + 14}px`;
    },
    hide() { tip.hidden = true; },
  };
}

// Markers on the loss-scale chart: every decision as a vertical dashed line at its effective
// step, every skipped step as a red dot at the scale it used. marks() returns the current
// {skips: [{step, loss_scale, ...}], decisions: [{effective_from_step, ...}]}; describe(kind,
// mark) returns the nodes of its hover text. The steps drawn are written to the holder as
// data-skip-steps and data-decision-steps (the browser test checks them against the API).
export function scaleMarkers(holder, marks, describe) {
  const tip = tooltip(holder);
  const visible = (u, step) => step >= u.scales.x.min && step <= u.scales.x.max;
  return {
    hooks: {
      draw: [(u) => {
        const { skips, decisions } = marks();
        const ctx = u.ctx;
        const { left, top, width, height } = u.bbox;
        ctx.save();
        ctx.beginPath();
        ctx.rect(left, top, width, height);
        ctx.clip();
        const drawnDecisions = decisions.filter((d) => visible(u, d.effective_from_step));
        ctx.strokeStyle = DECISION_COLOUR;
        ctx.lineWidth = 2 * devicePixelRatio;
        ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
        for (const d of drawnDecisions) {
          const x = Math.round(u.valToPos(d.effective_from_step, 'x', true));
          ctx.beginPath();
          ctx.moveTo(x, top);
          ctx.lineTo(x, top + height);
          ctx.stroke();
        }
        ctx.setLineDash([]);
        ctx.restore();
        // Dots are not clipped: one at the first or last step stays whole.
        const drawnSkips = skips.filter((s) => visible(u, s.step) && s.loss_scale > 0);
        ctx.fillStyle = SKIP_COLOUR;
        for (const s of drawnSkips) {
          const x = u.valToPos(s.step, 'x', true);
          const y = u.valToPos(s.loss_scale, 'y', true);
          ctx.beginPath();
          ctx.arc(x, y, 4.5 * devicePixelRatio, 0, 2 * Math.PI);
          ctx.fill();
        }
        const ascending = (steps) => [...new Set(steps)].sort((a, b) => a - b).join(',');
        holder.dataset.skipSteps = ascending(drawnSkips.map((s) => s.step));
        holder.dataset.decisionSteps = ascending(drawnDecisions.map((d) => d.effective_from_step));
      }],
      setCursor: [(u) => {
        const { left, top } = u.cursor;
        if (left === undefined || left < 0) { tip.hide(); return; }
        const { skips, decisions } = marks();
        const near = (step) => Math.abs(u.valToPos(step, 'x') - left) <= 5;
        const hitSkips = skips.filter((s) => near(s.step) && visible(u, s.step) &&
          Math.abs(u.valToPos(s.loss_scale, 'y') - top) <= 10);
        const hitDecisions = decisions.filter((d) => near(d.effective_from_step) && visible(u, d.effective_from_step));
        if (hitSkips.length === 0 && hitDecisions.length === 0) { tip.hide(); return; }
        tip.show(u, left, top, [
          ...hitDecisions.flatMap((d) => describe('decision', d)),
          ...hitSkips.flatMap((s) => describe('skip', s)),
        ]);
      }],
    },
  };
}
