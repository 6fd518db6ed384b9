// The web UI's page-load benchmark (docs/benchmarks.md#web-ui): headless Chromium opens a run's
// page on a running ampscope-server and times it from navigation to every chart drawn
// (body[data-ready="1"], which the page sets once its data is on screen), once cold (a fresh
// browser: assets, API answer, drawing) and then --loads times in new tabs; then the page of the
// run's worst tensor the same way. Writes a JSON fragment with webui_run_page_load_s (the median
// of the timed loads), _max, _cold, webui_tensor_page_load_s and the size of the API answer the
// page fetched.
//
//   node bench/webui_page_load.mjs --url http://127.0.0.1:9465 --run bench-long \
//     [--steps N] [--loads 5] [--out fragment.json] [--node-modules server/webui/node_modules]
import { writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { launchBrowser, loadPage, openPage } from '../tests/webui/browser.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));

function parseArgs(argv) {
  const o = { url: '', run: '', steps: null, loads: 5, out: '',
    nodeModules: path.join(here, '..', 'server', 'webui', 'node_modules') };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === '--url') o.url = value.replace(/\/$/, '');
    else if (flag === '--run') o.run = value;
    else if (flag === '--steps') o.steps = Number(value);
    else if (flag === '--loads') o.loads = Number(value);
    else if (flag === '--out') o.out = value;
    else if (flag === '--node-modules') o.nodeModules = value;
    else throw new Error(`unknown flag ${flag}`);
  }
  if (!o.url || !o.run) throw new Error('--url and --run are required');
  if (!Number.isInteger(o.loads) || o.loads < 1) throw new Error('--loads takes a count >= 1');
  return o;
}

function median(values) {
  const v = [...values].sort((a, b) => a - b);
  const m = Math.floor(v.length / 2);
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

const round3 = (x) => Math.round(x * 1000) / 1000;

// Loads `url` in a new tab of `browser`; fails on any console error. Returns seconds.
async function timedLoad(browser, url) {
  const page = await openPage(browser);
  try {
    const seconds = await loadPage(page, url, { timeout: 30000 });
    if (page.errors.length) throw new Error(`${url}: ${page.errors.join('; ')}`);
    return seconds;
  } finally {
    await page.close();
  }
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const runUrl = `${o.url}/runs/${encodeURIComponent(o.run)}`;

  // What the page asks for: the run at the width of its charts (the page's own request is the
  // one timed; this one only records the answer's size and the run's extent).
  const apiStarted = performance.now();
  const answer = await fetch(`${o.url}/api/runs/${encodeURIComponent(o.run)}?width=1000`);
  const apiSeconds = (performance.now() - apiStarted) / 1000;
  if (!answer.ok) throw new Error(`GET /api/runs/${o.run}: HTTP ${answer.status}`);
  const body = await answer.text();
  const run = JSON.parse(body);
  const worst = run.tensors && run.tensors.length ? run.tensors[0] : null;

  const browser = await launchBrowser(o.nodeModules, { width: 1400, height: 900 });
  try {
    const cold = await timedLoad(browser, runUrl);
    const warm = [];
    for (let i = 0; i < o.loads; ++i) warm.push(await timedLoad(browser, runUrl));
    const tensor = [];
    if (worst) {
      const tensorUrl = `${runUrl}/tensors?name=${encodeURIComponent(worst.name)}` +
        `&role=${encodeURIComponent(worst.role)}`;
      for (let i = 0; i < o.loads; ++i) tensor.push(await timedLoad(browser, tensorUrl));
    }
    const result = {
      webui_run_page_load_s: round3(median(warm)),
      webui_run_page_load_s_max: round3(Math.max(...warm)),
      webui_run_page_load_s_cold: round3(cold),
      webui_run_page_loads: warm.map(round3),
      webui_tensor_page_load_s: tensor.length ? round3(median(tensor)) : null,
      webui_run_api_s: round3(apiSeconds),
      webui_run_api_bytes: body.length,
      webui_run_steps: o.steps ?? (run.range ? run.range.last_step - run.range.first_step + 1 : null),
      webui_run_reports: run.run ? run.run.reports : null,
      webui_run_decisions: run.decisions ? run.decisions.length : null,
      webui_viewport: '1400x900',
      webui_cpu: os.cpus()[0] ? os.cpus()[0].model : null,
    };
    console.log(`run page (${result.webui_run_steps} steps): median ${result.webui_run_page_load_s} s ` +
      `over ${o.loads} loads (max ${result.webui_run_page_load_s_max} s, cold ` +
      `${result.webui_run_page_load_s_cold} s); tensor page ${result.webui_tensor_page_load_s} s; ` +
      `API answer ${result.webui_run_api_bytes} bytes in ${result.webui_run_api_s} s`);
    if (o.out) writeFileSync(o.out, `${JSON.stringify(result, null, 2)}\n`);
  } finally {
    await browser.close();
  }
}

main().catch((error) => {
  console.error(`webui_page_load: ${error.message}`);
  process.exit(1);
});
