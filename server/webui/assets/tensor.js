// A tensor's page: its binade heatmap with the format windows, and its counts over time.
// A drag on the counts chart re-queries that step range (the server picks one sample per
// bucket), a double click goes back to the whole run.
import { el, fmt, getJson, markReady, runHref, tensorHref } from './api.js';
import { Chart, LOG2, LOG10, PALETTE, expLabels, pow2Labels, sparseAsPoints } from './charts.js';
import { FLIGHT_COLOUR, FORMAT_COLOURS, Heatmap, rampColour } from './heatmap.js';

// The phases a tensor can be measured in; the page links to the others (a weight gradient's
// flight-recorder history, for instance, is measured after unscaling).
const PHASES = ['step_start', 'forward', 'backward', 'after_unscale'];

export async function showTensor(main, run_id, name, role, phase) {
  if (!name || !role) throw new Error('a tensor page needs ?name=<tensor>&role=<role>');
  const title = el('div');
  const note = el('p', { class: 'note' });
  const toggles = el('div', { class: 'formats' });
  const canvas = el('canvas', { id: 'heatmap', 'aria-label': 'binade histogram over steps' });
  const box = el('div', { class: 'heatmap-box' }, canvas);
  const chartBox = el('div');
  main.replaceChildren(title, note, toggles, box, chartBox);

  const heatmap = new Heatmap(canvas, box);
  const counts = new Chart(chartBox, {
    name: 'tensor_counts', title: 'Per sample: share of values that underflow, overflow, are subnormal or non-finite in its target format; max |x| and min |x| (unscaled)',
    height: 240, onZoom: (from, to) => load(from === null ? null : { from: Math.max(0, from), to }),
    xRange: () => [tensor.range.from, tensor.range.to],
    scales: { y: LOG10, abs: LOG2 },
    axes: [{ values: expLabels, size: 60 }, { scale: 'abs', side: 1, values: pow2Labels, size: 56, grid: { show: false } }],
  });
  let enabled = null;
  let tensor = null;

  async function load(zoom) {
    const q = new URLSearchParams({ name, role, width: Math.max(10, Math.min(2000, Math.round(main.clientWidth / 3))) });
    if (phase) q.set('phase', phase);
    if (zoom) { q.set('from', zoom.from); q.set('to', zoom.to); }
    tensor = await getJson(`/api${runHref(run_id)}/tensor?${q}`);
    if (enabled === null) {
      // The tensor's own format and BF16 start on; the 8-bit formats on demand.
      enabled = new Set([tensor.format, 'fp16', 'bf16'].filter((f) => tensor.formats.some((x) => x.name === f)));
      drawToggles();
    }
    drawTitle();
    heatmap.draw(tensor, enabled);
    drawPlacements();
    drawCounts();
  }

  function drawTitle() {
    const t = tensor;
    const g = t.range;
    title.replaceChildren(
      el('h1', {}, `Tensor ${t.name}`),
      el('div', { class: 'toolbar' }, 'Phase:', PHASES.map((p) => (p === t.phase ? el('b', {}, p)
        : el('a', { href: tensorHref(run_id, t.name, t.role, p) }, p)))),
      el('div', { class: 'facts' },
        `run `, el('a', { href: runHref(run_id) }, run_id), ` · role ${t.role} · phase ${t.phase} · dtype ${t.dtype}`,
        ` · target format ${t.format} · ${t.columns.length} samples in steps ${fmt(g.from)}–${fmt(g.to)}`));
    const lines = [];
    if (g.bucket_steps > 1) {
      lines.push(`Each column is one sample: the latest full sample in its bucket of ${fmt(g.bucket_steps)} steps (lowest rank), not a sum.`);
    }
    const recorded = t.columns.filter((c) => c.from_flight_recorder).length;
    if (recorded) lines.push(`${recorded} columns come from the flight recorder (marked in amber above the plot).`);
    if (t.columns.some((c) => c.histogram && c.histogram.approximate_shift)) {
      lines.push('Some scales are not powers of two: those columns are shifted by floor(log2(scale)), within one binade.');
    }
    if (t.columns.length === 0) lines.push('No full sample of this tensor in this range.');
    note.replaceChildren(lines.join(' '));
  }

  function drawToggles() {
    const bar = el('canvas', { class: 'colorbar', width: 140, height: 10 });
    const ctx = bar.getContext('2d');
    for (let x = 0; x < 140; x += 1) { ctx.fillStyle = rampColour(x / 139); ctx.fillRect(x, 0, 1, 10); }
    toggles.replaceChildren(
      el('span', {}, 'Format windows at each column\'s scale:'),
      ...tensor.formats.map((f) => el('label', {},
        el('input', { type: 'checkbox', checked: enabled.has(f.name), dataset: { format: f.name }, onchange: (e) => {
          if (e.target.checked) enabled.add(f.name); else enabled.delete(f.name);
          heatmap.draw(tensor, enabled);
          drawPlacements();
        } }),
        swatch(FORMAT_COLOURS[f.name]), f.name, el('span', { class: 'muted', dataset: { placement: f.name } }))),
      el('span', { class: 'muted' }, '— overflow above · - - normal from · ··· subnormal from'),
      el('span', {}, 'share of values: 10^-6 ', bar, ' 1'),
      el('span', {}, swatch(FLIGHT_COLOUR), 'flight recorder'));
  }

  // A format whose lines are not on the chart says why next to its toggle.
  function drawPlacements() {
    const words = { normal: ' (all normal here)', off: ' (window outside the chart)', drawn: '' };
    for (const f of tensor.formats) {
      const span = toggles.querySelector(`[data-placement="${f.name}"]`);
      if (span) span.textContent = words[heatmap.windowPlacement(f)];
    }
  }

  function drawCounts() {
    const cols = tensor.columns;
    const share = (c, n) => (n > 0 && c.numel > 0 ? n / c.numel : null);
    const target = (c) => c.targets[0] || { underflow: 0, overflow: 0, subnormal: 0 };
    const positive = (v) => (v > 0 ? v : null);
    const data = [cols.map((c) => c.step),
      cols.map((c) => share(c, target(c).underflow)), cols.map((c) => share(c, target(c).overflow)),
      cols.map((c) => share(c, target(c).subnormal)), cols.map((c) => share(c, c.nan + c.pos_inf + c.neg_inf)),
      cols.map((c) => positive(c.max_abs)), cols.map((c) => positive(c.min_abs_nonzero))];
    const ratio = (v) => (v === null ? '—' : v.toExponential(2));
    counts.set(data, sparseAsPoints([
      { label: 'underflow', stroke: PALETTE[0], value: (u, v) => ratio(v) },
      { label: 'overflow', stroke: PALETTE[6], value: (u, v) => ratio(v) },
      { label: 'subnormal', stroke: PALETTE[2], value: (u, v) => ratio(v) },
      { label: 'non-finite', stroke: '#d62728', points: { show: true, size: 7 }, value: (u, v) => ratio(v) },
      { label: 'max |x|', stroke: '#555', dash: [6, 4], scale: 'abs', value: (u, v) => fmt(v) },
      { label: 'min |x| ≠ 0', stroke: '#999', dash: [2, 3], scale: 'abs', value: (u, v) => fmt(v) },
    ], data, tensor.range.buckets));
  }

  await load(null);
  markReady();
}

function swatch(colour) {
  const node = el('span', { class: 'swatch' });
  node.style.borderTopColor = colour;
  return node;
}
