// A tensor's page: its binade heatmap with the format windows, and its counts over time; for a
// quantiser's input (an FP8/FP4 GEMM input), the recipe in use drawn over the heatmap, the
// quantiser's facts and its counts and SQNR per sample. A drag on a chart re-queries that step
// range (the server picks one sample per bucket), a double click goes back to the whole run.
import { el, facts, fmt, fmtRatio, fmtScale, getJson, lossCostText, markReady, runHref,
  tensorHref } from './api.js';
import { Chart, LOG2, LOG10, PALETTE, expLabels, pow2Labels, sparseAsPoints } from './charts.js';
import { FLIGHT_COLOUR, FORMAT_COLOURS, Heatmap, RECIPE_COLOUR, rampColour } from './heatmap.js';

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
  const quantizerBox = el('div', { class: 'quantizer' });
  const quantizerChartBox = el('div');
  main.replaceChildren(title, note, toggles, box, chartBox, quantizerBox, quantizerChartBox);

  const heatmap = new Heatmap(canvas, box);
  const onZoom = (from, to) => load(from === null ? null : { from: Math.max(0, from), to });
  const counts = new Chart(chartBox, {
    name: 'tensor_counts', title: 'Per sample: share of values that underflow, overflow, are subnormal or non-finite in its target format; max |x| and min |x| (unscaled)',
    height: 240, onZoom,
    xRange: () => [tensor.range.from, tensor.range.to],
    scales: { y: LOG10, abs: LOG2 },
    axes: [{ values: expLabels, size: 60 }, { scale: 'abs', side: 1, values: pow2Labels, size: 56, grid: { show: false } }],
  });
  const quantizerCounts = new Chart(quantizerChartBox, {
    name: 'quantizer_counts', height: 220, onZoom,
    title: 'Per quantiser sample: share of its values that underflow, are subnormal, saturate or overflow under the recipe; SQNR (dB, right axis)',
    xRange: () => [tensor.range.from, tensor.range.to],
    scales: { y: LOG10, db: {} },
    axes: [{ values: expLabels, size: 60 }, { scale: 'db', side: 1, size: 50, grid: { show: false } }],
    noData: 'no quantiser sample in this range',
  });
  let enabled = null;
  let tensor = null;
  let quantizerName = null;  // the quantiser whose recipe is drawn; '' for none

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
    if (quantizerName === null || (quantizerName && !selected())) {
      // The quantiser of the same name (the GEMM input itself) first, else the first listed.
      const own = tensor.quantizers.find((q) => q.name === name) || tensor.quantizers[0];
      quantizerName = own ? own.name : '';
    }
    drawTitle();
    heatmap.draw(tensor, enabled, selected());
    drawPlacements();
    drawCounts();
    drawQuantizer();
  }

  const selected = () => tensor.quantizers.find((q) => q.name === quantizerName) || null;

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
    if (t.columns.length === 0) {
      lines.push(t.quantizers.length ? 'No full sample of this tensor in this range: its quantisers\' recipes are drawn without a histogram.'
        : 'No full sample of this tensor in this range.');
    }
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
    const words = { normal: ' (all normal here)', off: ' (window outside the chart)', drawn: '', none: ' (no sample)' };
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

  // The quantiser picker, its facts (totals over the run, the latest sample) and its counts.
  function drawQuantizer() {
    const qs = tensor.quantizers;
    quantizerChartBox.hidden = qs.length === 0;
    if (qs.length === 0) { quantizerBox.replaceChildren(); return; }
    const q = selected();
    const picker = el('select', { dataset: { quantizer: '' }, onchange: (e) => {
      quantizerName = e.target.value;
      heatmap.draw(tensor, enabled, selected());
      drawQuantizer();
    } }, el('option', { value: '' }, 'none'),
    qs.map((x) => el('option', { value: x.name, selected: x.name === quantizerName }, `${x.name} (${x.recipe})`)));
    const rows = [el('h2', {}, 'FP8/FP4 quantiser'),
      el('div', { class: 'formats' }, el('label', {}, swatch(RECIPE_COLOUR), 'Recipe drawn over the heatmap:', picker),
        el('span', { class: 'muted' }, q && q.block ? 'band: darker where more blocks keep the binade normal; ▬ amax'
          : '— overflow above · - - normal from · ··· subnormal from; ▬ amax'))];
    if (q) {
      const t = q.totals;
      const last = q.samples.length ? q.samples[q.samples.length - 1] : null;
      const items = [['recipe', q.recipe], ['scaling', q.scaling], ['element', q.element.name]];
      if (last && last.layer) items.push(['layer', last.layer]);
      if (last) items.push(['latest sample', `step ${fmt(last.step)}${last.what_if ? ' (what-if: the GEMM ran in BF16)' : ''}`]);
      if (t) {
        items.push(['samples', fmt(t.samples)], ['values', fmt(t.values)],
          ['underflow', fmtRatio(t.underflow_ratio)], ['saturated', fmtRatio(t.saturated_ratio)],
          ['subnormal', fmtRatio(t.values ? t.subnormal / t.values : null)], ['SQNR', sqnrText(t)],
          ['amax', `${fmt(t.amax)} (latest ${fmt(t.last_amax)})`]);
        if (t.loss_cost_samples) items.push(['loss cost (nats/step)', lossCostText(t)]);
        if (q.block) {
          items.push(['block scales', bandWords(q)],
            ['blocks', `${fmt(t.blocks)} (zero ${fmt(t.zero_blocks)}, saturated ${fmt(t.saturated_blocks)}, NaN ${fmt(t.nan_blocks)})`]);
        }
        if (t.tensor_scale_max > 0) {
          items.push(['tensor scale', `${fmtScale(t.tensor_scale_min)}..${fmtScale(t.tensor_scale_max)} (latest ${fmtScale(t.last_tensor_scale)})`]);
        }
      }
      if (last && last.amax_history.length) items.push(['amax history', historyText(last.amax_history)]);
      rows.push(facts(items));
    }
    quantizerBox.replaceChildren(...rows);
    if (!q || q.samples.length === 0) { quantizerCounts.set([[]], []); return; }
    const share = (x, n) => (n > 0 && x.values > 0 ? n / x.values : null);
    const data = [q.samples.map((x) => x.step),
      ...['underflow', 'subnormal', 'saturated', 'overflow'].map((k) => q.samples.map((x) => share(x, x[k]))),
      q.samples.map((x) => x.sqnr_db)];
    const ratio = (v) => (v === null ? '—' : v.toExponential(2));
    quantizerCounts.set(data, sparseAsPoints([
      { label: 'underflow', stroke: PALETTE[0], value: (u, v) => ratio(v) },
      { label: 'subnormal', stroke: PALETTE[2], value: (u, v) => ratio(v) },
      { label: 'saturated', stroke: PALETTE[6], value: (u, v) => ratio(v) },
      { label: 'overflow', stroke: '#d62728', value: (u, v) => ratio(v) },
      { label: 'SQNR dB', stroke: '#555', dash: [6, 4], scale: 'db', value: (u, v) => fmt(v, 3) },
    ], data, tensor.range.buckets));
  }

  await load(null);
  markReady();
}

// Which binades a block keeps, in words: the band's top and the binades every block keeps.
function bandWords(q) {
  const t = q.totals;
  if (!t || t.scale_min_exponent === null) return '—';
  return `2^${t.scale_min_exponent}..2^${t.scale_max_exponent}`;
}

const sqnrText = (x) => (x.exact ? '∞ (exact)' : x.sqnr_db === null ? '—' : `${fmt(x.sqnr_db, 3)} dB`);

// The amax history a delayed scale came from: its length, extremes and latest entries.
function historyText(history) {
  if (!history || history.length === 0) return '—';
  const max = Math.max(...history);
  const last = history.slice(-4).map((v) => fmt(v)).join(', ');
  return `${history.length} entries, max ${fmt(max)}, latest ${last}`;
}

function swatch(colour) {
  const node = el('span', { class: 'swatch' });
  node.style.borderTopColor = colour;
  return node;
}
