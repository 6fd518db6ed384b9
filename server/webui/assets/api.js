// What every page shares: JSON fetches with error display, DOM building, number formats,
// links between pages and the markers the browser test reads (data-ready, data-updates).

export class ApiError extends Error {}

// Fetches /api JSON. A 401 sends the user to the login form and comes back here afterwards;
// any other error status throws with the server's {"error": ...} text.
export async function getJson(url) {
  let response;
  try {
    response = await fetch(url, { credentials: 'same-origin', headers: { Accept: 'application/json' } });
  } catch (e) {
    throw new ApiError(`${url}: the server did not answer (${e.message})`);
  }
  if (response.status === 401) {
    location.assign('/login?next=' + encodeURIComponent(location.pathname + location.search));
    throw new ApiError('signing in…');
  }
  let body = null;
  try { body = await response.json(); } catch { /* reported below */ }
  if (!response.ok) {
    const why = body && body.error ? body.error : response.statusText;
    throw new ApiError(`${url}: ${response.status} ${why}`);
  }
  if (body === null) throw new ApiError(`${url}: the answer is not JSON`);
  return body;
}

export function showError(message) {
  const line = document.getElementById('error');
  line.textContent = message;
  line.hidden = false;
}

export function clearError() {
  const line = document.getElementById('error');
  line.textContent = '';
  line.hidden = true;
}

// Runs fn now and every period_ms after the previous run ended; errors show in the error line
// and the polling goes on (a restarting server comes back without a reload).
export function poll(period_ms, fn) {
  let stopped = false;
  const tick = async () => {
    if (stopped) return;
    try {
      await fn();
      clearError();
    } catch (e) {
      showError(e.message);
    }
    if (!stopped) setTimeout(tick, period_ms);
  };
  setTimeout(tick, period_ms);
  return () => { stopped = true; };
}

// el('a', {href: '/'}, 'text', child...): attributes starting with "on" become listeners,
// "dataset" an object of data-* values; children are nodes or text (never parsed as HTML).
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key === 'class') node.className = value;
    else node.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function markReady() { document.body.dataset.ready = '1'; }

export function bumpUpdates() {
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
}

export const runHref = (run_id) => `/runs/${encodeURIComponent(run_id)}`;

export function tensorHref(run_id, name, role, phase) {
  const q = new URLSearchParams({ name, role });
  if (phase) q.set('phase', phase);
  return `${runHref(run_id)}/tensors?${q}`;
}

// One formatter for every integer: Number.toLocaleString builds a new one per call (35 ms of a
// 100,000-step run's page for its tables).
const integers = new Intl.NumberFormat('en-US');

// Numbers: null (the API's NaN/Inf) prints as an em dash.
export function fmt(x, digits = 4) {
  if (x === null || x === undefined) return '—';
  if (typeof x !== 'number') return String(x);
  if (Number.isInteger(x) && Math.abs(x) < 1e15) return integers.format(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(2);
  return x.toPrecision(digits).replace(/\.?0+$/, '');
}

// A power of two prints as 2^k, anything else as a number.
export function fmtScale(x) {
  if (x === null || x === undefined) return '—';
  const k = Math.log2(x);
  return Number.isInteger(k) ? `2^${k}` : fmt(x);
}

export function fmtRatio(x) {
  if (x === null || x === undefined) return '—';
  if (x === 0) return '0';
  return x < 1e-4 ? x.toExponential(1) : (100 * x).toPrecision(3) + '%';
}

export function fmtAgo(ns, now_ns) {
  if (!ns) return '—';
  const s = Math.max(0, (now_ns - ns) / 1e9);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${Math.round(s / 3600)} h ago`;
  return new Date(ns / 1e6).toISOString().slice(0, 16).replace('T', ' ');
}

export function badge(status) {
  return el('span', { class: `badge ${status}` }, status);
}

// Alerts by name (one condition can fire for several roles): the worst severity, every summary
// in the hover text.
export function alertList(alerts) {
  if (!alerts || alerts.length === 0) return el('span', { class: 'muted' }, 'none');
  const byName = new Map();
  for (const a of alerts) {
    const seen = byName.get(a.name);
    if (!seen) byName.set(a.name, { ...a, summaries: [a.summary] });
    else {
      seen.summaries.push(a.summary);
      if (a.severity === 'critical') seen.severity = 'critical';
    }
  }
  return el('span', {}, [...byName.values()].map((a) =>
    el('span', { class: `alert ${a.severity}`, title: a.summaries.join('\n') }, a.name.replace(/^Ampscope/, ''))));
}

// Facts as a definition list: [[label, value], ...]; value a node or text. Each <dd> carries
// data-fact=<key> when the fact has one (the browser test reads last_step).
export function facts(items) {
  return el('dl', { class: 'facts' }, items.map(([label, value, key]) =>
    el('div', {}, el('dt', {}, label), el('dd', { dataset: key ? { fact: key } : {} }, value))));
}

// The loss cost over the run: mean ± two standard errors, nats per step; '—' when not measured.
export function lossCostText(q) {
  if (!q.loss_cost_samples) return '—';
  const sci = (v) => v.toExponential(1);
  const half = 2 * q.loss_cost_stddev / Math.sqrt(q.loss_cost_samples);
  return `${q.loss_cost_mean >= 0 ? '+' : ''}${sci(q.loss_cost_mean)} ± ${sci(half)} (n ${fmt(q.loss_cost_samples)})`;
}
