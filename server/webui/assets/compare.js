// Two runs on shared axes: loss, loss scale and the weight gradients' underflow ratio. Both
// are fetched with the same width; uPlot.join aligns their steps.
import { el, fmtRatio, getJson, markReady, runHref } from './api.js';
import { Chart, LOG2, LOG10, PALETTE, expLabels, pow2Labels, sparseAsPoints } from './charts.js';

export async function showCompare(main, a, b) {
  const { runs } = await getJson('/api/runs');
  const picker = (name, value) => el('select', { name, 'aria-label': `run ${name}` },
    el('option', { value: '' }, '(choose a run)'),
    runs.map((r) => el('option', { value: r.run_id, selected: r.run_id === value }, r.run_id)));
  const form = el('form', { class: 'toolbar', method: 'get', action: '/compare' },
    'Run A', picker('a', a), 'Run B', picker('b', b), el('button', { type: 'submit' }, 'Compare'));
  form.addEventListener('change', () => form.submit());
  const charts = el('div');
  main.replaceChildren(el('h1', {}, 'Compare two runs'), form, charts);
  if (!a || !b) {
    charts.append(el('p', { class: 'muted' }, 'Choose two runs.'));
    markReady();
    return;
  }
  const width = Math.max(10, Math.min(4000, Math.round(main.clientWidth)));
  const [da, db] = await Promise.all([a, b].map((id) => getJson(`/api${runHref(id)}?width=${width}`)));
  const both = (label, extra = {}) => [
    { label: `${a} ${label}`, stroke: PALETTE[0], ...extra },
    { label: `${b} ${label}`, stroke: PALETTE[1], dash: [6, 3], ...extra }];
  const xRange = () => [Math.min(da.range.from, db.range.from), Math.max(da.range.to, db.range.to)];
  const join = (pick) => uPlot.join([da, db].map((d) => [d.steps.step, pick(d)]));

  new Chart(charts, { name: 'compare_loss', title: 'Loss', sync: 'compare', xRange })
    .set(join((d) => d.steps.loss), both('loss'));
  new Chart(charts, { name: 'compare_scale', title: 'Loss scale', sync: 'compare', xRange, scales: { y: LOG2 },
                      axes: [{ values: pow2Labels, size: 56 }] })
    .set(join((d) => d.steps.scale_last), both('scale', { paths: uPlot.paths.stepped({ align: 1 }) }));
  // A log axis once some step underflows (its zeros are then gaps); zero everywhere draws as
  // a flat line at 0 on a linear axis rather than as no data.
  const ratios = uPlot.join([da, db].map(underflow));
  const log = ratios.slice(1).some((ys) => ys.some((y) => y > 0));
  const data = log ? ratios.map((ys, i) => (i === 0 ? ys : ys.map((y) => (y > 0 ? y : y === undefined ? y : null))))
    : ratios;
  new Chart(charts, { name: 'compare_underflow',
                      title: `Weight-gradient underflow per checked value (all formats)${log ? '' : ': none in either run'}`,
                      sync: 'compare', xRange, scales: log ? { y: LOG10 } : { y: { range: [0, 1] } },
                      axes: [log ? { values: expLabels, size: 60 } : { size: 60 }],
                      noData: 'neither run reports weight-gradient counts' })
    .set(data, sparseAsPoints(both('underflow', { value: (u, v) => fmtRatio(v) }), data,
                              Math.max(da.steps.step.length, db.steps.step.length)));
  markReady();
}

// [steps, underflow/checked] summed over the formats of the weight_grad role.
function underflow(d) {
  const byStep = new Map();
  for (const c of d.counts.filter((x) => x.role === 'weight_grad')) {
    c.step.forEach((s, i) => {
      const t = byStep.get(s) || { checked: 0, underflow: 0 };
      t.checked += c.checked[i];
      t.underflow += c.underflow[i];
      byStep.set(s, t);
    });
  }
  // Only the steps where something was checked (full samples).
  const steps = [...byStep.keys()].filter((s) => byStep.get(s).checked > 0).sort((x, y) => x - y);
  return [steps, steps.map((s) => byStep.get(s).underflow / byStep.get(s).checked)];
}
