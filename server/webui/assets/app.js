// The router: every page route serves index.html, which shows the page that location.pathname
// names. Routes: /  /runs/<id>  /runs/<id>/tensors?name=&role=[&phase=]  /compare?a=&b=
import { showError } from './api.js';
import { showCompare } from './compare.js';
import { showRun } from './run.js';
import { showRuns } from './runs.js';
import { showTensor } from './tensor.js';

async function route() {
  const main = document.getElementById('main');
  const path = location.pathname;
  const query = new URLSearchParams(location.search);
  let m;
  if (path === '/' || path === '/runs') {
    document.title = 'ampscope: runs';
    return showRuns(main);
  }
  if ((m = path.match(/^\/runs\/([^/]+)\/tensors\/?$/))) {
    const run_id = decodeURIComponent(m[1]);
    document.title = `ampscope: ${query.get('name')} in ${run_id}`;
    return showTensor(main, run_id, query.get('name'), query.get('role'), query.get('phase'));
  }
  if ((m = path.match(/^\/runs\/([^/]+)\/?$/))) {
    const run_id = decodeURIComponent(m[1]);
    document.title = `ampscope: ${run_id}`;
    return showRun(main, run_id);
  }
  if (path === '/compare') {
    document.title = 'ampscope: compare';
    return showCompare(main, query.get('a'), query.get('b'));
  }
  main.replaceChildren();
  throw new Error(`no page at ${path}`);
}

route().catch((e) => {
  const main = document.getElementById('main');
  if (main.textContent.startsWith('Loading')) main.replaceChildren();
  showError(e.message);
});
