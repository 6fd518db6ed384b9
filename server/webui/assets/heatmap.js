// The binade heatmap of one tensor on a plain canvas: x = its samples (columns) over steps,
// y = binade exponent e in the unscaled domain (row e holds |x| in [2^e, 2^(e+1))), colour =
// log10 of the column's share of values in that binade. Over it, per column, each enabled
// format's window at the scale the tensor carried there: a value x is stored as x*S, so format
// F overflows above F.max/S (solid line), is normal down to F.min_normal/S (dashed line) and
// subnormal down to F.min_subnormal/S (dotted line, band shaded); below that it flushes to zero.
// A quantiser's recipe is drawn the same way per sample of the quantiser (per-tensor recipes),
// or as a band of the binades its blocks keep, shaded by the share of blocks (block recipes):
// recipe_windows.js.
import { el, fmt, fmtScale } from './api.js';
import { testHook } from './charts.js';
import { bandText, blockBand, perTensorWindow, region } from './recipe_windows.js';

export const FORMAT_COLOURS = { fp16: '#e8590c', bf16: '#2b8a3e', e4m3: '#c2255c', e5m2: '#7048e8' };
export const FLIGHT_COLOUR = '#f59f00';
export const RECIPE_COLOUR = '#e03131';
const MARGIN = { left: 58, right: 14, top: 14, bottom: 30 };
const SHARE_FLOOR = -6;          // log10 share drawn as the lightest colour
// A light-to-dark blue ramp (the format lines stay readable over it).
const RAMP = [[222, 235, 247], [158, 202, 225], [66, 146, 198], [8, 81, 156], [8, 29, 88]];

export function rampColour(t) {
  const x = Math.max(0, Math.min(1, t)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(x));
  const f = x - i;
  const c = RAMP[i].map((v, k) => Math.round(v + (RAMP[i + 1][k] - v) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

export class Heatmap {
  constructor(canvas, box) {
    this.canvas = canvas;
    this.tip = el('div', { class: 'tip', hidden: true });
    box.append(this.tip);
    this.tensor = null;
    this.enabled = new Set();
    canvas.addEventListener('mousemove', (e) => this.hover(e));
    canvas.addEventListener('mouseleave', () => { this.tip.hidden = true; });
    this.recipe = null;
    window.addEventListener('resize', () => this.tensor && this.draw(this.tensor, this.enabled));
  }

  // recipe: one of tensor.quantizers (drawn over the cells), or null.
  draw(tensor, enabled, recipe = this.recipe) {
    this.tensor = tensor;
    this.enabled = enabled;
    this.recipe = recipe || null;
    const width = Math.max(300, this.canvas.clientWidth);
    const height = 420;
    const ratio = window.devicePixelRatio || 1;
    this.canvas.width = Math.round(width * ratio);
    this.canvas.height = Math.round(height * ratio);
    this.canvas.style.height = `${height}px`;
    const ctx = this.canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    this.layout(tensor, width, height);
    this.drawCells(ctx);
    this.drawRecipe(ctx);
    this.drawWindows(ctx, tensor.formats.filter((f) => enabled.has(f.name)));
    this.drawAxes(ctx, width, height);
    testHook().heatmap = this;
  }

  // Geometry: the columns' x extents and the exponent range shown.
  layout(tensor, width, height) {
    const cols = tensor.columns;
    const gaps = cols.slice(1).map((c, i) => c.step - cols[i].step).sort((a, b) => a - b);
    // A column spans the typical gap to the next one (a run sampled every N steps fills the
    // width), and at least a quarter of the width per column when there are few.
    const span = cols.length ? cols[cols.length - 1].step - cols[0].step + 1 : 1;
    const typical = Math.max(tensor.range.bucket_steps || 1, gaps.length ? gaps[gaps.length >> 1] : 1,
                             Math.ceil(span / (4 * Math.max(1, cols.length))));
    // The steps asked for, widened to the columns (a bucket's sample can sit at its end).
    const samples = this.recipe ? this.recipe.samples : [];
    const steps = [...cols, ...samples].map((c) => c.step);
    const x0 = Math.min(tensor.range.from, ...steps);
    const x1 = Math.max(tensor.range.to + 1, ...steps.map((step) => step + typical));
    const plotW = width - MARGIN.left - MARGIN.right;
    const xOf = (step) => MARGIN.left + ((step - x0) / Math.max(1, x1 - x0)) * plotW;
    const spans = (list, key) => list.map((c, i) => {
      const next = i + 1 < list.length ? Math.min(list[i + 1].step, c.step + typical) : c.step + typical;
      return { [key]: c, left: xOf(c.step), right: Math.max(xOf(c.step) + 1, xOf(next)) };
    });
    this.cells = spans(cols, 'column');
    this.recipeCells = spans(samples, 'sample').map((c) => ({ ...c, ...recipeShape(this.recipe, c.sample) }));
    let lo = Infinity;
    let hi = -Infinity;
    for (const c of cols) {
      const h = c.histogram;
      if (!h) continue;
      const first = h.counts.findIndex((n) => n > 0);
      if (first < 0) continue;
      let last = h.counts.length - 1;
      while (h.counts[last] === 0) last -= 1;
      lo = Math.min(lo, h.min_exponent + first);
      hi = Math.max(hi, h.min_exponent + last);
    }
    // The recipe's reach: its samples' amax and the band's top, or the window's overflow edge.
    for (const c of this.recipeCells) {
      const edges = c.band ? [c.band.top, c.band.allNormal ? c.band.allNormal[0] : c.band.bottom]
        : [Math.floor(Math.log2(c.window.max)), Math.floor(Math.log2(c.window.min_subnormal))];
      if (c.amax > 0) edges.push(Math.floor(Math.log2(c.amax)));
      for (const e of edges) {
        if (e === null || !Number.isFinite(e)) continue;
        if (lo > hi || (e > lo - 24 && e < hi + 24)) { lo = Math.min(lo, e); hi = Math.max(hi, e); }
      }
    }
    if (lo > hi) { lo = -20; hi = 4; }
    // Show the compute format's window edges when they are near the data.
    const compute = tensor.formats.find((f) => f.name === tensor.format);
    if (compute) {
      for (const c of cols) {
        const s = c.loss_scale > 0 ? c.loss_scale : 1;
        for (const edge of [compute.max, compute.min_subnormal]) {
          const e = Math.floor(Math.log2(edge / s));
          if (e > lo - 24 && e < hi + 24) { lo = Math.min(lo, e); hi = Math.max(hi, e); }
        }
      }
    }
    this.eMin = lo - 1;
    this.eMax = hi + 1;
    this.plot = { left: MARGIN.left, top: MARGIN.top, width: plotW, height: height - MARGIN.top - MARGIN.bottom };
    this.rowH = this.plot.height / (this.eMax - this.eMin + 1);
    this.xOf = xOf;
    this.x0 = x0;
    this.x1 = x1;
  }

  // y of a (fractional) exponent: row e spans [yOf(e + 1), yOf(e)].
  yOf(e) { return this.plot.top + (this.eMax + 1 - e) * this.rowH; }

  drawCells(ctx) {
    ctx.fillStyle = '#fafbfc';
    ctx.fillRect(this.plot.left, this.plot.top, this.plot.width, this.plot.height);
    for (const { column, left, right } of this.cells) {
      const h = column.histogram;
      if (h) {
        const total = h.counts.reduce((a, b) => a + b, 0);
        h.counts.forEach((n, k) => {
          const e = h.min_exponent + k;
          if (n === 0 || e < this.eMin || e > this.eMax) return;
          ctx.fillStyle = rampColour(1 - Math.log10(n / total) / SHARE_FLOOR);
          // Whole pixels: fractional edges would leave hairlines between the cells.
          const top = Math.floor(this.yOf(e + 1));
          const x = Math.floor(left);
          ctx.fillRect(x, top, Math.ceil(right) - x, Math.ceil(this.yOf(e)) - top);
        });
      }
      if (column.from_flight_recorder) {
        ctx.fillStyle = FLIGHT_COLOUR;
        ctx.fillRect(left, this.plot.top - 6, Math.max(1, right - left), 4);
      }
    }
  }

  // The recipe in use, per quantiser sample: a per-tensor recipe's window as the formats' (solid
  // overflow, dashed normal, dotted subnormal, the subnormal range shaded); a block recipe's band
  // row by row, darker where more blocks keep the binade normal, lighter where blocks keep it
  // only as subnormals. A short black tick marks the sample's amax.
  drawRecipe(ctx) {
    if (!this.recipe) return;
    ctx.save();
    ctx.beginPath();
    ctx.rect(this.plot.left, this.plot.top, this.plot.width, this.plot.height);
    ctx.clip();
    ctx.fillStyle = RECIPE_COLOUR;
    ctx.strokeStyle = RECIPE_COLOUR;
    for (const c of this.recipeCells) {
      const w = c.right - c.left;
      if (c.band) {
        for (const row of c.band.rows) {
          if (row.e < this.eMin || row.e > this.eMax) continue;
          ctx.globalAlpha = 0.06 + 0.44 * (row.normal / c.band.blocks) + 0.2 * (row.subnormal / c.band.blocks);
          const top = this.yOf(row.e + 1);
          ctx.fillRect(c.left, top, w, this.yOf(row.e) - top);
        }
      } else {
        ctx.globalAlpha = 0.12;
        const top = this.yOf(Math.log2(c.window.min_normal));
        ctx.fillRect(c.left, top, w, this.yOf(Math.log2(c.window.min_subnormal)) - top);
        ctx.globalAlpha = 1;
        for (const [value, width, dash] of [[c.window.max, 2, []], [c.window.min_normal, 1.5, [6, 4]],
                                            [c.window.min_subnormal, 1.2, [2, 3]]]) {
          ctx.lineWidth = width;
          ctx.setLineDash(dash);
          ctx.beginPath();
          ctx.moveTo(c.left, this.yOf(Math.log2(value)));
          ctx.lineTo(c.right, this.yOf(Math.log2(value)));
          ctx.stroke();
        }
      }
      if (c.amax > 0) {
        ctx.globalAlpha = 1;
        ctx.fillStyle = '#000';
        ctx.fillRect(c.left, this.yOf(Math.log2(c.amax)) - 1, Math.max(2, w / 3), 2);
        ctx.fillStyle = RECIPE_COLOUR;
      }
    }
    ctx.restore();
  }

  // Where format f's window edges fall relative to the exponents shown: 'drawn' when one is in
  // view, else 'normal' (the whole view is in its normal range) or 'off' (outside it); 'none'
  // without a column (a quantiser's page: no scale to draw it at).
  windowPlacement(f) {
    if (this.cells.length === 0) return 'none';
    let normal = true;
    for (const { column } of this.cells) {
      const s = column.loss_scale > 0 ? column.loss_scale : 1;
      const edges = [f.max, f.min_normal, f.min_subnormal].map((v) => Math.log2(v / s));
      if (edges.some((e) => e > this.eMin && e < this.eMax + 1)) return 'drawn';
      normal = normal && edges[1] <= this.eMin && edges[0] >= this.eMax + 1;
    }
    return normal ? 'normal' : 'off';
  }

  drawWindows(ctx, formats) {
    ctx.save();
    ctx.beginPath();
    ctx.rect(this.plot.left, this.plot.top, this.plot.width, this.plot.height);
    ctx.clip();
    for (const f of formats) {
      const colour = FORMAT_COLOURS[f.name] || '#000';
      const edge = (c, value) => Math.log2(value / (c.loss_scale > 0 ? c.loss_scale : 1));
      ctx.fillStyle = colour;
      ctx.globalAlpha = 0.1;
      for (const { column, left, right } of this.cells) {
        const top = this.yOf(edge(column, f.min_normal));
        ctx.fillRect(left, top, right - left, this.yOf(edge(column, f.min_subnormal)) - top);
      }
      ctx.globalAlpha = 1;
      ctx.strokeStyle = colour;
      for (const [value, width, dash] of [[f.max, 2, []], [f.min_normal, 1.5, [6, 4]], [f.min_subnormal, 1.2, [2, 3]]]) {
        ctx.lineWidth = width;
        ctx.setLineDash(dash);
        ctx.beginPath();
        // A line per run of adjacent columns, stepping where the scale changes; none across a
        // gap between samples, where nobody measured the scale.
        let previous = null;
        for (const { column, left, right } of this.cells) {
          const y = this.yOf(edge(column, value));
          if (previous && left - previous.right < 1) {
            ctx.lineTo(left, previous.y);
            ctx.lineTo(left, y);
          } else {
            ctx.moveTo(left, y);
          }
          ctx.lineTo(right, y);
          previous = { right, y };
        }
        ctx.stroke();
      }
    }
    ctx.restore();
  }

  drawAxes(ctx, width, height) {
    const { left, top, width: w, height: h } = this.plot;
    ctx.strokeStyle = '#9aa7bd';
    ctx.lineWidth = 1;
    ctx.setLineDash([]);
    ctx.strokeRect(left, top, w, h);
    ctx.fillStyle = '#444';
    ctx.font = '11px system-ui, sans-serif';
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    const every = Math.max(1, Math.ceil(14 / this.rowH));
    for (let e = Math.ceil(this.eMin / every) * every; e <= this.eMax; e += every) {
      ctx.fillText(`2^${e}`, left - 6, (this.yOf(e) + this.yOf(e + 1)) / 2);
    }
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    const span = this.x1 - this.x0;
    const raw = span / 8;
    const mag = 10 ** Math.floor(Math.log10(Math.max(1, raw)));
    const tick = [1, 2, 5, 10].map((m) => m * mag).find((t) => t >= raw) || mag * 10;
    for (let s = Math.ceil(this.x0 / tick) * tick; s < this.x1; s += tick) {
      const x = this.xOf(s);
      ctx.fillText(fmt(s), x, top + h + 6);
      ctx.fillRect(x, top + h, 1, 4);
    }
    ctx.fillText('step', left + w / 2, height - 12);
  }

  hover(event) {
    if (!this.tensor) return;
    const rect = this.canvas.getBoundingClientRect();
    const x = event.clientX - rect.left;
    const y = event.clientY - rect.top;
    const cell = this.cells.find((c) => x >= c.left && x < c.right);
    const e = Math.floor(this.eMax + 1 - (y - this.plot.top) / this.rowH);
    if (y < this.plot.top || y > this.plot.top + this.plot.height) { this.tip.hidden = true; return; }
    if (!cell) {
      const lines = this.recipeLines(x, e);
      this.tip.replaceChildren(el('div', {}, `binade [2^${e}, 2^${e + 1})`), ...lines);
      this.tip.hidden = lines.length === 0;
      this.place(x, y, rect);
      return;
    }
    const c = cell.column;
    const h = c.histogram;
    const count = h ? (h.counts[e - h.min_exponent] || 0) : null;
    const total = h ? h.counts.reduce((a, b) => a + b, 0) : 0;
    const scale = c.loss_scale > 0 ? c.loss_scale : 1;
    const lines = [
      el('b', {}, `step ${fmt(c.step)} (rank ${c.rank})${c.from_flight_recorder ? ', flight recorder' : ''}`),
      el('div', {}, `binade [2^${e}, 2^${e + 1})`),
      el('div', {}, h ? `count ${fmt(count)} of ${fmt(total)}${count ? ` (${(100 * count / total).toPrecision(3)}%)` : ''}`
        : 'this sample has no histogram'),
      el('div', {}, `scale ${fmtScale(scale)}`),
      ...this.tensor.formats.filter((f) => this.enabled.has(f.name)).map((f) =>
        el('div', {}, `${f.name}: ${region(f, 2 ** e * scale, 2 ** (e + 1) * scale)}`)),
      ...this.recipeLines(x, e),
    ];
    this.tip.replaceChildren(...lines);
    this.tip.hidden = false;
    this.place(x, y, rect);
  }

  place(x, y, rect) {
    this.tip.style.left = `${Math.min(x + 14, rect.width - 260)}px`;
    this.tip.style.top = `${y + 14}px`;
  }

  // What the recipe's sample under x does with binade e.
  recipeLines(x, e) {
    const c = this.recipe && this.recipeCells.find((r) => x >= r.left && x < r.right);
    if (!c) return [];
    const s = c.sample;
    const what = c.band ? bandText(c.band, e) : region(c.window, 2 ** e, 2 ** (e + 1));
    return [el('div', {}, `${this.recipe.recipe} at step ${fmt(s.step)}${s.what_if ? ' (what-if)' : ''}: ${what}`)];
  }
}

// A quantiser sample's window (per-tensor recipes) or band (block recipes) in the unscaled
// domain, and its amax there.
function recipeShape(recipe, sample) {
  const amax = sample.amax / (sample.loss_scale > 0 ? sample.loss_scale : 1);
  if (recipe.block) return { band: blockBand(recipe.element, sample.scale_histogram, sample.loss_scale), amax };
  return { window: perTensorWindow(recipe.element, sample.tensor_scale, sample.loss_scale), amax };
}
