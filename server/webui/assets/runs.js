// The runs page: every run the server holds, with a search box and sortable columns; polls
// every 5 s.
import { alertList, badge, bumpUpdates, el, fmt, fmtAgo, fmtScale, getJson, markReady, poll,
         runHref } from './api.js';
import { table } from './table.js';

const SEVERITY = { critical: 2, warning: 1 };

export async function showRuns(main) {
  const search = el('input', { type: 'search', placeholder: 'filter by run id, trainer or precision',
                               'aria-label': 'filter runs' });
  const count = el('span', { class: 'muted' });
  const holder = el('div');
  main.replaceChildren(el('h1', {}, 'Runs'), el('div', { class: 'toolbar' }, search, count), holder);

  let answer = null;
  let sortBy = null;
  const columns = [
    { label: 'Run', value: (r) => el('a', { href: runHref(r.run_id) }, r.run_id), sort: (r) => r.run_id },
    { label: 'Status', value: (r) => badge(r.status), sort: (r) => r.status },
    { label: 'Last step', value: (r) => fmt(r.last_step), sort: (r) => r.last_step, num: true },
    { label: 'Skipped', value: (r) => fmt(r.skipped_steps), sort: (r) => r.skipped_steps, num: true },
    { label: 'Alerts', value: (r) => alertList(r.alerts),
      sort: (r) => -Math.max(0, ...r.alerts.map((a) => SEVERITY[a.severity] || 0)) },
    { label: 'Policy', value: (r) => r.policy_mode || '—', sort: (r) => r.policy_mode },
    { label: 'Precision', value: (r) => r.precision, sort: (r) => r.precision },
    { label: 'Trainer', value: (r) => r.trainer, sort: (r) => r.trainer },
    { label: 'Ranks', value: (r) => fmt(r.world_size), sort: (r) => r.world_size, num: true },
    { label: 'Loss', value: (r) => fmt(r.loss), sort: (r) => r.loss, num: true },
    { label: 'Scale', value: (r) => fmtScale(r.loss_scale), sort: (r) => r.loss_scale, num: true },
    { label: 'Last seen', value: (r) => fmtAgo(r.last_seen_unix_ns, answer.now_unix_ns),
      sort: (r) => -r.last_seen_unix_ns },
  ];

  function draw() {
    const words = search.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    const rows = answer.runs.filter((r) => words.every((w) =>
      [r.run_id, r.trainer, r.precision].some((f) => (f || '').toLowerCase().includes(w))));
    count.textContent = `${rows.length} of ${answer.runs.length} runs`;
    const node = table('runs', columns, rows, { sortBy, empty: 'no run matches' });
    // Keep the user's sort across redraws.
    node.querySelectorAll('th').forEach((th, i) => th.addEventListener('click', () => {
      sortBy = { column: i, descending: th.classList.contains('sorted-desc') };
    }));
    holder.replaceChildren(node);
  }

  search.addEventListener('input', draw);
  answer = await getJson('/api/runs');
  draw();
  markReady();
  poll(5000, async () => {
    answer = await getJson('/api/runs');
    draw();
    bumpUpdates();
  });
}
