// A run's page: facts, loss and loss-scale charts (skips and policy decisions marked), the
// counts by role and format, per-rank step time and tensor-core use, and the tables. Polls
// every 2 s with `since` (an unchanged run costs one tiny answer) and redraws in place; a drag
// on any chart re-queries that step range, a double click (or "whole run") goes back.
import { alertList, badge, bumpUpdates, el, facts, fmt, fmtAgo, fmtRatio, fmtScale, getJson,
         lossCostText, markReady, poll, runHref, tensorHref } from './api.js';
import { Chart, LOG2, LOG10, PALETTE, expLabels, pow2Labels, scaleMarkers,
         sparseAsPoints } from './charts.js';
import { scroll, table } from './table.js';

// The per-step tables open most recent first (their first column is the step or id).
const latestFirst = { column: 0, descending: true };
const KINDS = [['underflow', []], ['overflow', [6, 4]], ['nonfinite', [2, 3]]];

export async function showRun(main, run_id) {
  const page = new RunPage(main, run_id);
  await page.load();
  markReady();
  poll(2000, () => page.refresh());
}

class RunPage {
  constructor(main, run_id) {
    this.run_id = run_id;
    this.zoom = null;          // {from, to} while the user looks at part of the run
    this.generation = 0;       // bumped by every zoom: answers to older requests are stale
    this.detail = null;
    this.main = main;
    this.header = el('div');
    this.zoomLine = el('div', { class: 'note' });
    const onZoom = (from, to) => this.setZoom(from, to);
    const xRange = () => [this.detail.range.from, this.detail.range.to];
    const charts = el('div', { class: 'grid2' });
    const left = el('div');
    const right = el('div');
    charts.append(left, right);
    this.loss = new Chart(left, {
      name: 'loss', title: 'Loss', sync: 'run', onZoom, xRange,
      series: [{ label: 'loss', stroke: PALETTE[0] },
               { label: 'validation loss', stroke: PALETTE[1], spanGaps: true, points: { show: true, size: 6 } }],
    });
    this.scale = new Chart(right, {
      name: 'scale', title: 'Loss scale', sync: 'run', onZoom, xRange,
      series: [{ label: 'loss scale', stroke: PALETTE[2], paths: uPlot.paths.stepped({ align: 1 }) }],
      scales: { y: { ...LOG2, range: (u, lo, hi) => this.scaleRange(lo, hi) } },
      axes: [{ values: pow2Labels, size: 56 }],
      plugins: (holder) => [scaleMarkers(holder, () => this.marks(), (kind, mark) => this.describe(kind, mark))],
    });
    right.append(el('div', { class: 'legend-marks' },
      el('span', { class: 'skip' }, '● skipped step'), '   ',
      el('span', { class: 'decision' }, '┆ policy decision (effective step; hover for its reason)')));
    const counts = el('div');
    this.counts = new Chart(counts, {
      name: 'counts', title: 'Underflow, overflow and non-finite values per checked value, by role and format',
      height: 260, sync: 'run', onZoom, xRange, scales: { y: LOG10 }, axes: [{ values: expLabels, size: 60 }],
      noData: 'no counts in this range',
    });
    const ranks = el('div', { class: 'grid2' });
    const rl = el('div');
    const rr = el('div');
    ranks.append(rl, rr);
    this.stepTime = new Chart(rl, { name: 'step_time', title: 'Step time per rank (s)', sync: 'run', onZoom, xRange,
                                    noData: 'no data: this run reports no step time' });
    this.tensorCore = new Chart(rr, {
      name: 'tensor_core', title: 'Tensor-core active ratio per rank', sync: 'run', onZoom, xRange,
      noData: 'no data: this run reports no tensor-core utilisation (CPU, or no profiler access)',
    });
    this.tables = el('div');
    main.replaceChildren(this.header, this.zoomLine, charts, counts, ranks, this.tables);
  }

  width() { return Math.max(10, Math.min(4000, Math.round(this.main.clientWidth / 2))); }

  url(since) {
    const q = new URLSearchParams({ width: this.width() });
    if (this.zoom) { q.set('from', this.zoom.from); q.set('to', this.zoom.to); }
    if (since !== undefined) q.set('since', since);
    return `/api${runHref(this.run_id)}?${q}`;
  }

  async load() { this.apply(await getJson(this.url())); }

  async refresh() {
    const generation = this.generation;
    const answer = await getJson(this.url(this.detail.max_report_id));
    if (answer.unchanged || generation !== this.generation) return;
    this.apply(answer);
    bumpUpdates();
  }

  // Every chart of the page reports the same drag (their cursors are synced): one request per
  // new range, and an answer for a range the user has left is dropped.
  async setZoom(from, to) {
    const zoom = from === null ? null : { from: Math.max(0, from), to };
    if (JSON.stringify(zoom) === JSON.stringify(this.zoom)) return;
    this.zoom = zoom;
    const generation = ++this.generation;
    const answer = await getJson(this.url());
    if (generation === this.generation) this.apply(answer);
  }

  marks() {
    const d = this.detail;
    return d ? { skips: d.skips, decisions: d.decisions } : { skips: [], decisions: [] };
  }

  // The y range of the scale chart holds the line and every skip marker, in whole binades.
  scaleRange(lo, hi) {
    for (const s of this.detail.skips) {
      if (s.loss_scale > 0) { lo = Math.min(lo, s.loss_scale); hi = Math.max(hi, s.loss_scale); }
    }
    const a = Math.floor(Math.log2(lo)) - 1;
    const b = Math.ceil(Math.log2(hi)) + 1;
    return [2 ** a, 2 ** b];
  }

  describe(kind, mark) {
    if (kind === 'skip') {
      // `why` names the step's first offender merged over the ranks, and the rank that held it.
      return [el('b', {}, `Skipped step ${mark.step} (rank ${mark.rank})`),
              el('div', {}, `scale ${fmtScale(mark.loss_scale)} → ${fmtScale(mark.scale_after)}; ${mark.why}`)];
    }
    return [el('b', {}, `Decision ${mark.policy_id} (${mark.mode}), effective from step ${mark.effective_from_step}`),
            el('div', {}, updateText(mark.update)),
            el('div', {}, mark.reason),
            el('ul', {}, mark.applications.length === 0 ? el('li', {}, 'no rank has applied it yet')
              : mark.applications.map((a) => el('li', {}, applicationText(a))))];
  }

  apply(d) {
    this.detail = d;
    this.drawHeader(d);
    const s = d.steps;
    this.loss.set([s.step, s.loss, s.val_loss]);
    this.scale.set([s.step, s.scale_last]);
    this.drawCounts(d.counts);
    this.drawRanks(d.ranks);
    this.drawTables(d);
  }

  drawHeader(d) {
    const r = d.run;
    const g = d.range;
    this.header.replaceChildren(
      el('h1', {}, `Run ${r.run_id} `, badge(r.status)),
      facts([
        ['first step', fmt(r.first_step)], ['last step', fmt(r.last_step), 'last_step'],
        ['skipped', fmt(r.skipped_steps)], ['loss', fmt(r.loss)], ['loss scale', fmtScale(r.loss_scale)],
        ['policy', r.policy_mode || '—'], ['precision', r.precision], ['compute format', r.compute_format],
        ['trainer', r.trainer], ['ranks', `${r.agents_connected} of ${r.world_size} connected`],
        ['reports', fmt(r.reports)], ['last seen', fmtAgo(r.last_seen_unix_ns, Date.now() * 1e6)],
        ['alerts', alertList(r.alerts)],
        ...(d.bf16_gemms.length ? [['BF16 GEMMs', `${d.bf16_gemms.join(' ')} (at step ${fmt(d.bf16_gemms_step)})`, 'bf16_gemms']] : []),
        ['compare', el('a', { href: `/compare?a=${encodeURIComponent(r.run_id)}` }, 'with another run')],
      ]));
    const bucket = g.bucket_steps > 1 ? `, ${fmt(g.bucket_steps)} steps per point` : '';
    this.zoomLine.replaceChildren(
      `Steps ${fmt(g.from)}–${fmt(g.to)} of ${fmt(g.first_step)}–${fmt(g.last_step)}${bucket}. `,
      this.zoom ? el('button', { dataset: { action: 'whole-run' }, onclick: () => this.setZoom(null, null) }, 'whole run')
        : 'Drag across a chart to zoom; double-click to go back.');
  }

  drawCounts(counts) {
    const series = [];
    const tables = [];
    counts.forEach((c, i) => {
      for (const [kind, dash] of KINDS) {
        // Only the buckets where something was measured; a zero is a gap on the log axis.
        const denominator = (j) => c.checked[j] + (kind === 'nonfinite' ? c[kind][j] : 0);
        const measured = c.step.map((_, j) => j).filter((j) => denominator(j) > 0);
        const ys = measured.map((j) => (c[kind][j] > 0 ? c[kind][j] / denominator(j) : null));
        if (ys.every((y) => y === null)) continue;
        series.push({ label: `${c.role} ${c.format} ${kind}`, stroke: PALETTE[i % PALETTE.length], dash,
                      value: (u, v) => fmtRatio(v) });
        tables.push([measured.map((j) => c.step[j]), ys]);
      }
    });
    if (tables.length === 0) { this.counts.set([[]], []); return; }
    const data = uPlot.join(tables);
    this.counts.set(data, sparseAsPoints(series, data, this.detail.steps.step.length));
  }

  drawRanks(ranks) {
    for (const [chart, field] of [[this.stepTime, 'step_time_s'], [this.tensorCore, 'tensor_core_active_ratio']]) {
      const withData = ranks.filter((r) => r[field].some((v) => v !== null));
      if (withData.length === 0) { chart.set([[]], []); continue; }
      chart.set(uPlot.join(withData.map((r) => [r.step, r[field]])),
                withData.map((r, i) => ({ label: `rank ${r.rank}`, stroke: PALETTE[i % PALETTE.length] })));
    }
  }

  drawTables(d) {
    const id = this.run_id;
    const tensorLink = (name, role, phase) => el('a', { href: tensorHref(id, name, role, phase) }, name);
    const offenderRole = new Map(d.offenders.map((o) => [`${o.step}/${o.rank}/${o.tensor}`, o]));
    const step = (label = 'Step') => ({ label, value: (r) => fmt(r.step), sort: (r) => r.step, num: true });
    const rank = { label: 'Rank', value: (r) => fmt(r.rank), sort: (r) => r.rank, num: true };
    const sections = [
      ['First offenders', 'The first tensor of each step with a non-finite value, in execution order.',
       table('offenders', [step(), rank,
         { label: 'Tensor', value: (o) => tensorLink(o.tensor, o.role, o.phase), sort: (o) => o.tensor },
         { label: 'Role', value: (o) => o.role, sort: (o) => o.role },
         { label: 'Phase', value: (o) => o.phase, sort: (o) => o.phase },
         { label: 'Order', value: (o) => fmt(o.order), sort: (o) => o.order, num: true },
         { label: 'Micro-step', value: (o) => fmt(o.micro_step), sort: (o) => o.micro_step, num: true }],
       d.offenders, { sortBy: latestFirst })],
      ['Skipped steps', null, table('skips', [step(), rank,
         { label: 'Scale', value: (s) => fmtScale(s.loss_scale), sort: (s) => s.loss_scale, num: true },
         { label: 'Scale after', value: (s) => fmtScale(s.scale_after), sort: (s) => s.scale_after, num: true },
         { label: 'found_inf', value: (s) => (s.found_inf ? 'yes' : 'no'), sort: (s) => s.found_inf },
         { label: 'Why', value: (s) => s.why, sort: (s) => s.why },
         { label: 'First offender', sort: (s) => s.offender, value: (s) => {
           if (!s.offender) return '—';
           const o = offenderRole.get(`${s.step}/${s.offender_rank}/${s.offender}`);
           return [o ? tensorLink(s.offender, o.role, o.phase) : s.offender, ` (rank ${s.offender_rank})`];
         } }], d.skips, { sortBy: latestFirst })],
      ['Policy decisions', null, table('decisions', [
         { label: 'Id', value: (p) => fmt(p.policy_id), sort: (p) => p.policy_id, num: true },
         { label: 'Effective step', value: (p) => fmt(p.effective_from_step), sort: (p) => p.effective_from_step, num: true },
         { label: 'Decided', value: (p) => fmtAgo(p.decided_unix_ns, Date.now() * 1e6), sort: (p) => p.decided_unix_ns },
         { label: 'Mode', value: (p) => p.mode },
         { label: 'Update', value: (p) => updateText(p.update) },
         { label: 'Reason', value: (p) => p.reason },
         { label: 'Applied by', value: (p) => el('div', {}, p.applications.map((a) => el('div', {}, applicationText(a)))) }],
       d.decisions, { sortBy: latestFirst, empty: 'no decision (the policy is observe-only, or had nothing to change)' })],
      ['Worst tensors', 'By non-finite values, then overflow ratio, then underflow ratio, against each tensor\'s first target format.',
       table('tensors', [
         { label: 'Tensor', value: (t) => tensorLink(t.name, t.role), sort: (t) => t.name },
         { label: 'Role', value: (t) => t.role, sort: (t) => t.role },
         { label: 'Format', value: (t) => t.format, sort: (t) => t.format },
         { label: 'Samples', value: (t) => fmt(t.samples), sort: (t) => t.samples, num: true },
         { label: 'Non-finite', value: (t) => fmt(t.nonfinite), sort: (t) => t.nonfinite, num: true },
         { label: 'Overflow', value: (t) => fmtRatio(t.overflow_ratio), sort: (t) => t.overflow_ratio, num: true },
         { label: 'Underflow', value: (t) => fmtRatio(t.underflow_ratio), sort: (t) => t.underflow_ratio, num: true },
         { label: 'max |x|', value: (t) => fmt(t.max_abs), sort: (t) => t.max_abs, num: true },
         { label: 'Last step', value: (t) => fmt(t.last_step), sort: (t) => t.last_step, num: true }],
       d.tensors, { rowClass: (t) => (t.nonfinite > 0 ? 'bad' : '') })],
      ...(d.quantizers.length === 0 ? [] : [['FP8/FP4 quantisers',
        'Every low-precision GEMM input of the run, summed over its samples: worst SQNR first, then most underflow. A name leads to its recipe\'s windows over the tensor\'s binades.',
        quantizerTable(d.quantizers, (q) => tensorLink(q.name, q.role))]]),
      ['Agents', null, table('agents', [rank,
         { label: 'Host', value: (a) => a.host },
         { label: 'Connected', value: (a) => (a.connected ? 'yes' : 'no') },
         { label: 'Last seen', value: (a) => fmtAgo(a.last_seen_unix_ns, Date.now() * 1e6) },
         { label: 'Last seq', value: (a) => fmt(a.last_seq), num: true },
         { label: 'Step time', value: (a) => (a.mean_step_time_s ? `${fmt(a.mean_step_time_s, 3)} s` : '—'), num: true },
         { label: 'Trainer', value: (a) => a.trainer },
         { label: 'Agent version', value: (a) => a.agent_version },
         { label: 'Counters', value: (a) => countersText(a.counters) },
         { label: 'Notices', value: (a) => el('div', {}, a.notices.map((n) => el('div', {}, n))) }], d.agents)],
      ['Rank divergences', 'Steps where the ranks disagreed on a value that should be the same on all of them.',
       table('divergences', [step(),
         { label: 'Field', value: (v) => v.field, sort: (v) => v.field },
         { label: 'Values', value: (v) => v.values.map((x) => `rank ${x.rank}: ${fmt(x.value)}`).join(', ') }],
       d.divergences, { empty: 'none' })],
    ];
    this.tables.replaceChildren(...sections.flatMap(([title, note, node]) =>
      [el('h2', {}, title), ...(note ? [el('p', { class: 'note' }, note)] : []), scroll(node)]));
  }
}

// Worst first: the lowest SQNR (an exact quantiser, or one without signal, last), then the
// largest underflow share.
function worstQuantizersFirst(quantizers) {
  const sqnr = (q) => (q.sqnr_db === null ? Infinity : q.sqnr_db);
  return quantizers.slice().sort((a, b) => sqnr(a) - sqnr(b) || b.underflow_ratio - a.underflow_ratio);
}

function quantizerTable(quantizers, link) {
  const sqnr = (q) => (q.exact ? '∞' : q.sqnr_db === null ? '—' : fmt(q.sqnr_db, 3));
  // Per-tensor recipes: the tensor scale's range; block recipes: the block scales' binades.
  const scale = (q) => (q.scale_min_exponent !== null ? `2^${q.scale_min_exponent}..2^${q.scale_max_exponent}`
    : q.tensor_scale_max > 0 ? `${fmtScale(q.tensor_scale_min)}..${fmtScale(q.tensor_scale_max)}` : '—');
  return table('quantizers', [
    { label: 'Quantiser', value: link, sort: (q) => q.name },
    { label: 'Role', value: (q) => q.role, sort: (q) => q.role },
    { label: 'Phase', value: (q) => q.phase, sort: (q) => q.phase },
    { label: 'Recipe', value: (q) => q.recipe, sort: (q) => q.recipe },
    { label: 'Samples', value: (q) => fmt(q.samples), sort: (q) => q.samples, num: true },
    { label: 'SQNR dB', value: sqnr, sort: (q) => (q.sqnr_db === null ? null : q.sqnr_db), num: true },
    { label: 'Underflow', value: (q) => fmtRatio(q.underflow_ratio), sort: (q) => q.underflow_ratio, num: true },
    { label: 'Saturated', value: (q) => fmtRatio(q.saturated_ratio), sort: (q) => q.saturated_ratio, num: true },
    { label: 'Scale', value: scale },
    { label: 'amax', value: (q) => fmt(q.amax), sort: (q) => q.amax, num: true },
    { label: 'Loss cost (nats/step)', value: lossCostText, sort: (q) => q.loss_cost_mean, num: true },
    { label: 'Last step', value: (q) => fmt(q.last_step), sort: (q) => q.last_step, num: true }],
  worstQuantizersFirst(quantizers), { rowClass: (q) => (q.overflow > 0 || q.nonfinite > 0 ? 'bad' : '') });
}

function updateText(update) {
  const parts = Object.entries(update || {}).map(([k, v]) =>
    `${k} ${k.endsWith('scale') ? fmtScale(v) : Array.isArray(v) ? v.join(' ') : fmt(v)}`);
  return parts.length ? parts.join(', ') : '—';
}

function applicationText(a) {
  return `rank ${a.rank}: ${a.applied ? 'applied' : 'refused'} at step ${fmt(a.step)}${a.reason ? ` (${a.reason})` : ''}`;
}

function countersText(counters) {
  const parts = Object.entries(counters || {}).filter(([, v]) => v !== 0).map(([k, v]) => `${k} ${fmt(v)}`);
  return parts.length ? parts.join(', ') : 'all zero';
}
