// Tables with sortable columns. A column is {label, value: row => node|text, sort: row => key,
// num: right-aligned}; clicking a header sorts by it (again: reverses). Long tables show their
// first `limit` rows (in the current order) and a button for the rest: a long run's thousand
// decisions would otherwise cost more to lay out than the rest of the page.
import { el, fmt } from './api.js';

export function table(name, columns, rows, { rowClass, sortBy, empty = 'none', limit = 200 } = {}) {
  const node = el('table', { dataset: { table: name } });
  const state = { column: sortBy ? sortBy.column : -1, descending: sortBy ? !!sortBy.descending : false };
  const head = el('tr', {}, columns.map((c, i) => el('th', {
    class: c.sort ? 'sortable' : '',
    onclick: c.sort ? () => {
      state.descending = state.column === i ? !state.descending : false;
      state.column = i;
      fill();
    } : undefined,
  }, c.label)));
  const body = el('tbody');
  node.append(el('thead', {}, head), body);

  function fill() {
    const sorted = rows.slice();
    if (state.column >= 0) {
      const key = columns[state.column].sort;
      sorted.sort((a, b) => compare(key(a), key(b)) * (state.descending ? -1 : 1));
    }
    head.querySelectorAll('th').forEach((th, i) => {
      th.classList.toggle('sorted-asc', i === state.column && !state.descending);
      th.classList.toggle('sorted-desc', i === state.column && state.descending);
    });
    const shown = sorted.length > limit ? sorted.slice(0, limit) : sorted;
    body.replaceChildren(...shown.map((row) => el('tr', { class: rowClass ? rowClass(row) : '' },
      columns.map((c) => el('td', { class: c.num ? 'num' : '' }, c.value(row))))));
    if (sorted.length === 0) {
      body.append(el('tr', {}, el('td', { class: 'muted', colspan: columns.length }, empty)));
    } else if (shown.length < sorted.length) {
      body.append(el('tr', {}, el('td', { class: 'muted', colspan: columns.length },
        `${fmt(shown.length)} of ${fmt(sorted.length)} rows `,
        el('button', { onclick: () => { limit = Infinity; fill(); } }, 'show all'))));
    }
  }
  fill();
  return node;
}

// Nulls sort last; numbers by value; everything else as text.
function compare(a, b) {
  if (a === b) return 0;
  if (a === null || a === undefined) return 1;
  if (b === null || b === undefined) return -1;
  if (typeof a === 'number' && typeof b === 'number') return a - b;
  return String(a).localeCompare(String(b));
}

// A scrolling box around a table (long lists stay one screen tall).
export const scroll = (node) => el('div', { class: 'table-wrap' }, node);
