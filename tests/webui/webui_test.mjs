// The web UI in headless Chromium against a real ampscope-server fed by real ampscope-train runs:
// the demo's run (amp-fp16, initial scale 2^24, a NaN injected into h0.mlp.fc at step 60), a
// short second run to compare with, and a slow third one watched live. Then the same store
// behind a token: the login form refuses a wrong token and lets a reader in.
//   node webui_test.mjs SERVER TRAIN BUILD_DIR NODE_MODULES
// Exit 0: passed; 1: failed (the reason on stderr); 77: skipped (chromium or npm packages missing).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { findChromium, launchBrowser, loadPage, openPage } from './browser.mjs';

const [SERVER, TRAIN, BUILD_DIR, NODE_MODULES] = process.argv.slice(2);
if (!NODE_MODULES) {
  console.error('usage: webui_test.mjs SERVER TRAIN BUILD_DIR NODE_MODULES');
  process.exit(2);
}
if (!findChromium()) {
  console.log('skipped: chromium is not installed (apt-get install chromium)');
  process.exit(77);
}
if (!fs.existsSync(path.join(NODE_MODULES, 'puppeteer-core'))) {
  console.log('skipped: puppeteer-core is not installed (npm ci --prefix server/webui)');
  process.exit(77);
}

const SHOTS = path.join(BUILD_DIR, 'webui', 'screenshots');
const WORK = fs.mkdtempSync(path.join(os.tmpdir(), 'ampscope-webui-'));
const DB = path.join(WORK, 'ampscope.db');
const READER_TOKEN = 'reader-token-for-the-web-ui-test';
const children = new Set();
const started = performance.now();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function check(condition, message) {
  if (!condition) throw new Error(message);
}

function log(message) {
  console.log(`[${((performance.now() - started) / 1000).toFixed(1)} s] ${message}`);
}

function launch(program, args, name) {
  const out = fs.openSync(path.join(WORK, `${name}.log`), 'w');
  const child = spawn(program, args, { stdio: ['ignore', out, out] });
  child.logName = name;
  children.add(child);
  child.done = new Promise((resolve) => child.on('exit', (code, signal) => {
    children.delete(child);
    resolve({ code, signal });
  }));
  return child;
}

const logTail = (name) => fs.readFileSync(path.join(WORK, `${name}.log`), 'utf8').split('\n').slice(-15).join('\n');

async function startServer(name, extra = []) {
  const ready = path.join(WORK, `${name}.ready.json`);
  const child = launch(SERVER, ['--listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0',
    '--http-listen', '127.0.0.1:0', '--db', DB, '--policy', 'headroom', '--ready-file', ready, ...extra], name);
  for (let i = 0; i < 200; i += 1) {
    if (fs.existsSync(ready) && fs.statSync(ready).size > 0) {
      const addresses = JSON.parse(fs.readFileSync(ready, 'utf8'));
      check(addresses.http, `${name}: the ready file names no "http" address: ${JSON.stringify(addresses)}`);
      return { child, grpc: addresses.grpc, base: `http://${addresses.http}` };
    }
    if (child.exitCode !== null) break;
    await sleep(50);
  }
  throw new Error(`${name} did not start; its log:\n${logTail(name)}`);
}

async function stop(child) {
  if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
  await child.done;
}

// The demo's training command line; --sample-count-roles adds the activations, so that the
// first offender of the NaN's step is the activation it was injected into rather than the loss.
function train(grpc, run_id, steps, extra = [], precision = 'amp-fp16') {
  return launch(TRAIN, ['--precision', precision, '--steps', String(steps), '--server', grpc,
    '--run-id', run_id, '--spool-dir', path.join(WORK, `spool-${run_id}`), '--quiet',
    '--sample-count-roles', 'activation,activation_grad,weight_grad,loss', ...extra], `train-${run_id}`);
}

async function trainToEnd(grpc, run_id, steps, extra, precision) {
  const child = train(grpc, run_id, steps, extra, precision);
  const { code, signal } = await child.done;
  check(code === 0, `ampscope-train ${run_id} failed (${code ?? signal}):\n${logTail(`train-${run_id}`)}`);
}

async function api(base, route, headers = {}) {
  const response = await fetch(base + route, { headers });
  const body = await response.json();
  return { status: response.status, body };
}

function noErrors(page, what) {
  check(page.errors.length === 0, `${what}: errors in the page:\n  ${page.errors.join('\n  ')}`);
}

async function screenshot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
}

// Colour distance in RGB.
const near = (pixel, rgb, tolerance = 60) =>
  Math.abs(pixel[0] - rgb[0]) + Math.abs(pixel[1] - rgb[1]) + Math.abs(pixel[2] - rgb[2]) <= tolerance;
const hex = (colour) => [1, 3, 5].map((i) => parseInt(colour.slice(i, i + 2), 16));

async function checkRunsPage(browser, base) {
  const page = await openPage(browser);
  await loadPage(page, `${base}/`);
  const ids = await page.$$eval('table[data-table="runs"] tbody tr td:first-child', (cells) => cells.map((c) => c.textContent));
  check(ids.includes('demo') && ids.includes('short'), `runs table: expected demo and short, found ${ids}`);
  await page.type('input[type="search"]', 'shor');
  const filtered = await page.$$eval('table[data-table="runs"] tbody tr td:first-child', (cells) => cells.map((c) => c.textContent));
  check(filtered.length === 1 && filtered[0] === 'short', `runs search "shor": found ${filtered}`);
  await page.evaluate(() => { const s = document.querySelector('input[type="search"]'); s.value = ''; s.dispatchEvent(new Event('input')); });
  // A click on "Last step" sorts by it, a second click reverses.
  const lastSteps = () => page.$$eval('table[data-table="runs"] tbody tr td:nth-child(3)',
    (cells) => cells.map((c) => Number(c.textContent.replace(/,/g, ''))));
  const header = async () => (await page.$$('table[data-table="runs"] th'))[2];
  await (await header()).click();
  const ascending = await lastSteps();
  await (await header()).click();
  const descending = await lastSteps();
  check(ascending.every((v, i) => i === 0 || ascending[i - 1] <= v) &&
        descending.join() === [...ascending].reverse().join(),
        `runs table sorted by last step: ${ascending}, then reversed: ${descending}`);
  noErrors(page, 'runs page');
  await page.close();
}

async function checkRunPage(browser, base) {
  const { body: run } = await api(base, '/api/runs/demo');
  const page = await openPage(browser);
  await loadPage(page, `${base}/runs/demo`);
  noErrors(page, 'run page');

  const offenders = await page.$$eval('table[data-table="offenders"] tbody tr',
    (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  check(offenders.some((cells) => cells[0] === '60' && cells[2] === 'h0.mlp.fc'),
        `offenders table: no row naming h0.mlp.fc at step 60: ${JSON.stringify(offenders)}`);

  // Skip markers and decision annotations: the steps drawn are the API's, and the canvas has the
  // marker colours where uPlot puts those steps.
  const apiSkips = [...new Set(run.skips.map((s) => s.step))].sort((a, b) => a - b);
  check(apiSkips.includes(60) && apiSkips.some((s) => s < 10),
        `the API's skipped steps should hold 60 and the early too-high-scale steps: ${apiSkips}`);
  const apiDecisions = [...new Set(run.decisions.map((d) => d.effective_from_step)
    .filter((s) => s >= run.range.from && s <= run.range.to))].sort((a, b) => a - b);
  check(apiDecisions.length > 0, 'the API lists no policy decision within the run (headroom policy)');
  const marks = await page.$eval('[data-chart="scale"]', (n) => [n.dataset.skipSteps, n.dataset.decisionSteps]);
  const drawnSkips = marks[0].split(',').filter(Boolean).map(Number).sort((a, b) => a - b);
  const drawnDecisions = marks[1].split(',').filter(Boolean).map(Number);
  check(JSON.stringify(drawnSkips) === JSON.stringify(apiSkips), `skip markers at ${drawnSkips}, the API skipped ${apiSkips}`);
  check(JSON.stringify(drawnDecisions) === JSON.stringify(apiDecisions),
        `decision markers at ${drawnDecisions}, the API's decisions take effect at ${apiDecisions}`);
  const pixels = await page.evaluate((skips, decisions) => {
    const u = window.ampscope.charts.scale;
    const pixel = (x, y) => [...u.ctx.getImageData(Math.round(x), Math.round(y), 1, 1).data];
    const column = (x) => {
      const { top, height } = u.bbox;
      return [...u.ctx.getImageData(Math.round(x), top, 1, height).data].reduce((acc, v, i, a) => (
        i % 4 === 0 ? [...acc, a.slice(i, i + 3)] : acc), []);
    };
    return {
      skips: skips.map((s) => pixel(u.valToPos(s.step, 'x', true), u.valToPos(s.loss_scale, 'y', true))),
      decisions: decisions.map((step) => ({ on: column(u.valToPos(step, 'x', true)), off: column(u.valToPos(step, 'x', true) + 10) })),
    };
  }, run.skips.map((s) => ({ step: s.step, loss_scale: s.loss_scale })), apiDecisions);
  const SKIP = hex('#d62728');
  const DECISION = hex('#7b3fbf');
  pixels.skips.forEach((p, i) => check(near(p, SKIP), `no skip marker pixel at step ${run.skips[i].step}: ${p}`));
  pixels.decisions.forEach(({ on, off }, i) => {
    const hits = on.filter((p) => near(p, DECISION)).length;
    check(hits > on.length / 4, `decision at step ${apiDecisions[i]}: ${hits} of ${on.length} pixels of its line`);
    const beside = off.filter((p) => near(p, DECISION)).length;
    check(beside === 0 || apiDecisions.some((s, j) => j !== i && Math.abs(s - apiDecisions[i]) < 8),
          `decision colour 10 px beside step ${apiDecisions[i]}`);
  });

  // Hovering a decision shows its reason and each rank's application.
  const where = await page.evaluate((step) => {
    const u = window.ampscope.charts.scale;
    const r = u.over.getBoundingClientRect();
    return [r.left + u.valToPos(step, 'x'), r.top + r.height / 2];
  }, apiDecisions[apiDecisions.length - 1]);
  await page.mouse.move(where[0], where[1]);
  const tip = await page.$eval('[data-chart="scale"] .tip', (t) => (t.hidden ? '' : t.textContent));
  const last = run.decisions.find((d) => d.effective_from_step === apiDecisions[apiDecisions.length - 1]);
  check(tip.includes(last.reason.slice(0, 40)), `decision tooltip without its reason: "${tip}"`);
  check(last.applications.every((a) => tip.includes(`rank ${a.rank}: ${a.applied ? 'applied' : 'refused'}`)),
        `decision tooltip without the ranks' applications: "${tip}"`);
  await page.screenshot({ path: path.join(SHOTS, 'run_decision_hover.png') });
  await page.mouse.move(1, 1);

  // Hovering the NaN's skipped step names its first offender and the rank that reported it, as
  // the skips table does.
  const nanSkip = run.skips.find((s) => s.step === 60);
  check(nanSkip && nanSkip.offender === 'h0.mlp.fc' && nanSkip.offender_rank === 0 &&
        nanSkip.why.includes('first offender h0.mlp.fc (') && nanSkip.why.includes(') on rank 0'),
        `the API's skip at step 60 without its first offender and rank: ${JSON.stringify(nanSkip)}`);
  const dot = await page.evaluate((s) => {
    const u = window.ampscope.charts.scale;
    const r = u.over.getBoundingClientRect();
    return [r.left + u.valToPos(s.step, 'x'), r.top + u.valToPos(s.loss_scale, 'y')];
  }, nanSkip);
  await page.mouse.move(dot[0], dot[1]);
  const skipTip = await page.$eval('[data-chart="scale"] .tip', (t) => (t.hidden ? '' : t.textContent));
  check(skipTip.includes('Skipped step 60') && skipTip.includes(nanSkip.why),
        `skip tooltip at step 60 without the first offender and its rank: "${skipTip}"`);
  await page.mouse.move(1, 1);
  const skipRows = await page.$$eval('table[data-table="skips"] tbody tr',
    (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  check(skipRows.some((cells) => cells[0] === '60' && cells[6] === 'h0.mlp.fc (rank 0)'),
        `skips table: no row naming h0.mlp.fc (rank 0) at step 60: ${JSON.stringify(skipRows)}`);

  await checkZoom(page, run, apiSkips, apiDecisions);

  for (const name of ['offenders', 'skips', 'decisions', 'tensors', 'agents']) {
    check(await page.$(`table[data-table="${name}"]`), `run page: no ${name} table`);
  }
  for (const name of ['loss', 'scale', 'counts', 'step_time', 'tensor_core']) {
    check(await page.$(`[data-chart="${name}"]`), `run page: no ${name} chart`);
  }
  await screenshot(page, 'run');

  // The offender's link leads to its tensor page.
  await Promise.all([page.waitForNavigation(),
    page.click('table[data-table="offenders"] a[href*="name=h0.mlp.fc&"]')]);
  await page.waitForSelector('body[data-ready="1"]');
  await checkHeatmap(page, 'tensor page of h0.mlp.fc (from the offenders table)');
  await page.close();
}

// A run of four steps: every chart's step axis ticks at whole steps (not 0.5, 1.5, ...), and a
// linear y axis whose data are all 0 spans 0..1 (uPlot's own range for it is 0..100).
async function checkShortRunAxes(browser, base) {
  const page = await openPage(browser);
  await loadPage(page, `${base}/runs/tiny`);
  noErrors(page, 'run page of a 4-step run');
  const axes = await page.evaluate(() => Object.entries(window.ampscope.charts).map(([name, u]) => ({
    name, ticks: u.axes[0]._splits || [], zero: u.scales.y && typeof u.scales.y.range === 'function' && u.scales.y.distr === 1
      ? u.scales.y.range(u, 0, 0, 'y') : null,
  })));
  check(axes.length >= 3, `4-step run: only ${axes.length} charts drawn`);
  for (const { name, ticks } of axes) {
    check(ticks.length >= 2 && ticks.every((t) => Number.isInteger(t)),
          `4-step run: the step axis of ${name} ticks at ${JSON.stringify(ticks)}, not whole steps`);
  }
  const stepTime = axes.find((a) => a.name === 'step_time');
  check(stepTime && JSON.stringify(stepTime.zero) === '[0,1]',
        `step time chart: an all-zero series spans ${JSON.stringify(stepTime && stepTime.zero)}, not 0..1`);
  await screenshot(page, 'run_short');
  await page.close();
  return axes.map((a) => `${a.name} ${a.ticks.join(',')}`).join('; ');
}

// A drag across the scale chart from step 40 to step 80 asks the server for that range: the
// markers left are those in it; "whole run" brings the rest back.
async function checkZoom(page, run, apiSkips, apiDecisions) {
  const [from, to] = [40, 80];
  const drag = await page.evaluate((a, b) => {
    const u = window.ampscope.charts.scale;
    const r = u.over.getBoundingClientRect();
    return [r.left + u.valToPos(a, 'x'), r.left + u.valToPos(b, 'x'), r.top + r.height / 3];
  }, from, to);
  await page.mouse.move(drag[0], drag[2]);
  await page.mouse.down();
  await page.mouse.move(drag[1], drag[2], { steps: 8 });
  await page.mouse.up();
  const inRange = (steps) => steps.filter((s) => s >= from - 1 && s <= to + 1).join(',');
  const expected = [inRange(apiSkips), inRange(apiDecisions)];
  const zoomed = () => page.evaluate(() => {
    const n = document.querySelector('[data-chart="scale"]');
    const x = window.ampscope.charts.loss.scales.x;
    return [n.dataset.skipSteps, n.dataset.decisionSteps, x.min, x.max];
  });
  await page.waitForFunction((skips) => document.querySelector('[data-chart="scale"]').dataset.skipSteps === skips,
                             { timeout: 10000 }, expected[0]).catch(() => {});
  const got = await zoomed();
  check(got[0] === expected[0] && got[1] === expected[1],
        `zoomed to steps ${from}-${to}: markers at ${got[0]} / ${got[1]}, expected ${expected[0]} / ${expected[1]}`);
  check(got[2] >= from - 2 && got[3] <= to + 2, `zoomed to steps ${from}-${to}: the loss chart spans ${got[2]}-${got[3]}`);
  await page.click('[data-action="whole-run"]');
  await page.waitForFunction((skips) => document.querySelector('[data-chart="scale"]').dataset.skipSteps === skips,
                             { timeout: 10000 }, apiSkips.join(',')).catch(() => {});
  const back = await zoomed();
  check(back[0] === apiSkips.join(','), `after "whole run": skip markers at ${back[0]}, expected ${apiSkips}`);
  noErrors(page, 'run page after zooming');
}

// The heatmap is drawn: at each column with a histogram, the centre of its fullest binade has a
// colour of the heatmap's blue ramp.
async function checkHeatmap(page, what) {
  noErrors(page, what);
  const result = await page.evaluate(() => {
    const h = window.ampscope.heatmap;
    const ctx = h.canvas.getContext('2d');
    const ratio = h.canvas.width / h.canvas.clientWidth;
    const cells = h.cells.filter((c) => c.column.histogram);
    return cells.map(({ column, left, right }) => {
      const counts = column.histogram.counts;
      const e = column.histogram.min_exponent + counts.indexOf(Math.max(...counts));
      const x = ((left + right) / 2) * ratio;
      const y = ((h.yOf(e) + h.yOf(e + 1)) / 2) * ratio;
      return [...ctx.getImageData(Math.round(x), Math.round(y), 1, 1).data];
    });
  });
  check(result.length > 0, `${what}: no column with a histogram`);
  const blue = result.filter(([r, , b, a]) => a === 255 && b > r + 20).length;
  check(blue >= result.length * 0.8, `${what}: ${blue} of ${result.length} columns drawn: ${JSON.stringify(result.slice(0, 5))}`);
  // Hovering the last column's fullest binade names its step, binade and count.
  const hover = await page.evaluate(() => {
    const h = window.ampscope.heatmap;
    const cell = h.cells.filter((c) => c.column.histogram).pop();
    const counts = cell.column.histogram.counts;
    const e = cell.column.histogram.min_exponent + counts.indexOf(Math.max(...counts));
    const r = h.canvas.getBoundingClientRect();
    return { x: r.left + (cell.left + cell.right) / 2, y: r.top + (h.yOf(e) + h.yOf(e + 1)) / 2,
             step: cell.column.step, e, count: Math.max(...counts).toLocaleString('en-US') };
  });
  await page.mouse.move(hover.x, hover.y);
  const tip = await page.$eval('.heatmap-box .tip', (t) => (t.hidden ? '' : t.textContent));
  check(tip.includes(`step ${hover.step.toLocaleString('en-US')}`) && tip.includes(`binade [2^${hover.e}, 2^${hover.e + 1})`) &&
        tip.includes(`count ${hover.count} of`), `${what}: hover text "${tip}" for step ${hover.step}, binade ${hover.e}`);
  await page.mouse.move(1, 1);
  return result.length;
}

async function checkTensorPage(browser, base) {
  const page = await openPage(browser);
  await loadPage(page, `${base}/runs/demo/tensors?name=h0.mlp.fc.weight&role=weight_grad`);
  const columns = await checkHeatmap(page, 'tensor page of h0.mlp.fc.weight');
  check(await page.$('[data-chart="tensor_counts"] canvas'), 'tensor page: no counts chart');
  await screenshot(page, 'tensor');
  // Its flight-recorder history (measured after unscaling), reached by the phase link.
  await Promise.all([page.waitForNavigation(), page.click('a[href*="phase=after_unscale"]')]);
  await page.waitForSelector('body[data-ready="1"]');
  const recorded = await checkHeatmap(page, 'tensor page of h0.mlp.fc.weight after unscaling');
  const note = await page.$eval('.note', (n) => n.textContent);
  check(/\d+ columns come from the flight recorder/.test(note), `no flight-recorder columns noted: "${note}"`);
  await screenshot(page, 'tensor_after_unscale');
  await page.close();
  return [columns, recorded];
}

// The last quantiser sample drawn on a tensor page's heatmap: its recipe, band or window,
// sample and the middle of its x extent; and the heatmap's exponents shown.
const lastRecipeCell = (page) => page.evaluate(() => {
  const h = window.ampscope.heatmap;
  const c = h.recipeCells[h.recipeCells.length - 1];
  return { recipe: h.recipe.recipe, eMax: h.eMax, band: c.band, window: c.window, sample: c.sample,
           x: (c.left + c.right) / 2 };
});

// The heatmap's pixel at x (CSS pixels in the canvas) and the (fractional) exponent e, and where
// that point is on the screen.
const heatmapPixel = (page, x, e) => page.evaluate((x, e) => {
  const h = window.ampscope.heatmap;
  const ratio = h.canvas.width / h.canvas.clientWidth;
  const y = h.yOf(e);
  const r = h.canvas.getBoundingClientRect();
  return { pixel: [...h.canvas.getContext('2d').getImageData(Math.round(x * ratio), Math.round(y * ratio), 1, 1).data],
           screen: [r.left + x, r.top + y] };
}, x, e);

// An FP8/FP4 run: the run page lists its quantisers worst SQNR first (then most underflow) and
// its BF16 GEMMs; a quantiser's link leads to its tensor page, where the recipe is drawn: NVFP4's
// band fills the binade most blocks keep normal and leaves the binades above the band empty, and
// the hover text counts the blocks; a delayed recipe's overflow line lies at 448 / scale.
async function checkQuantizerPages(browser, base) {
  const { body: run } = await api(base, '/api/runs/fp4');
  check(run.quantizers.length > 0, 'the nvfp4 run has no quantisers in the API');
  const sqnr = (q) => (q.sqnr_db === null ? Infinity : q.sqnr_db);
  const expected = run.quantizers.slice().sort((a, b) => sqnr(a) - sqnr(b) || b.underflow_ratio - a.underflow_ratio)
    .map((q) => q.name);
  const page = await openPage(browser);
  await loadPage(page, `${base}/runs/fp4`);
  noErrors(page, 'run page of the nvfp4 run');
  const listed = await page.$$eval('table[data-table="quantizers"] tbody tr td:first-child', (c) => c.map((x) => x.textContent));
  check(listed.join() === expected.slice(0, listed.length).join() && listed.length === Math.min(200, expected.length),
        `quantisers table: ${listed.slice(0, 5)}..., expected ${expected.slice(0, 5)}...`);
  // The output gradients carry their layer's loss cost (measured every 2nd step here): the
  // table shows mean ± 2 SE and the count the API gives; the other quantisers a dash.
  const headers = await page.$$eval('table[data-table="quantizers"] thead th', (c) => c.map((x) => x.textContent));
  const costColumn = headers.findIndex((h) => h.startsWith('Loss cost'));
  const cells = Object.fromEntries(await page.$$eval('table[data-table="quantizers"] tbody tr',
    (rows, i) => rows.map((r) => [r.children[0].textContent, r.children[i].textContent]), costColumn));
  const costed = run.quantizers.find((q) => q.name === 'h0.mlp.fc.output_grad');
  check(costColumn > 0 && costed && costed.loss_cost_samples > 0 &&
        /^[+-]\d\.\de[+-]\d+ ± \d\.\de[+-]\d+ \(n \d+\)$/.test(cells['h0.mlp.fc.output_grad']) &&
        cells['h0.mlp.fc.output_grad'].endsWith(`(n ${costed.loss_cost_samples})`) && cells['h0.mlp.fc.input'] === '—',
        `quantisers table: loss cost column ${costColumn}, cells ${JSON.stringify(cells).slice(0, 300)}`);
  const gemms = await page.$eval('[data-fact="bf16_gemms"]', (n) => n.textContent).catch(() => '');
  check(gemms.startsWith('h1.mlp.fc '), `run page: BF16 GEMMs "${gemms}", expected h1.mlp.fc`);
  await screenshot(page, 'run_fp4');
  await Promise.all([page.waitForNavigation(),
    page.click('table[data-table="quantizers"] a[href*="name=h0.mlp.fc.output_grad&"]')]);
  await page.waitForSelector('body[data-ready="1"]');
  noErrors(page, 'quantiser page of h0.mlp.fc.output_grad');
  const cell = await lastRecipeCell(page);
  const full = cell.band.rows.reduce((a, b) => (b.normal > a.normal ? b : a));
  const inside = await heatmapPixel(page, cell.x, full.e + 0.5);
  const above = cell.band.top + 2 <= cell.eMax ? (await heatmapPixel(page, cell.x, cell.band.top + 2.5)).pixel : null;
  const band = { recipe: cell.recipe, full: full.e, normal: full.normal, blocks: cell.band.blocks,
                 inside: inside.pixel, above, hover: inside.screen };
  check(band.recipe === 'nvfp4' && band.normal > 0, `nvfp4 band: no binade kept normal: ${JSON.stringify(band)}`);
  check(band.inside[0] > band.inside[2] + 40, `nvfp4 band not drawn at binade ${band.full}: ${band.inside}`);
  check(band.above === null || near(band.above, [250, 251, 252], 12), `nvfp4 band drawn above its top: ${band.above}`);
  await page.mouse.move(band.hover[0], band.hover[1]);
  const tip = await page.$eval('.heatmap-box .tip', (t) => (t.hidden ? '' : t.textContent));
  check(tip.includes('nvfp4 at step') && tip.includes(`normal in ${band.normal} of ${band.blocks} blocks`),
        `band hover text: "${tip}"`);
  await page.mouse.move(1, 1);
  await screenshot(page, 'tensor_fp4_band');
  await page.close();

  const delayed = await openPage(browser);
  await loadPage(delayed, `${base}/runs/fp8/tensors?name=h0.mlp.fc.weight&role=weight`);
  noErrors(delayed, 'tensor page of a delayed-scaled weight');
  const last = await lastRecipeCell(delayed);
  const line = { scale: last.sample.tensor_scale, max: last.window.max,
                 pixel: (await heatmapPixel(delayed, last.x, Math.log2(448 / last.sample.tensor_scale))).pixel };
  check(line.scale > 1 && line.max === 448 / line.scale, `delayed window: max ${line.max} at scale ${line.scale}`);
  // The line's red (#e03131, antialiased over the plot's near-white background).
  const [red, green, blue] = line.pixel;
  check(red > green + 80 && red > blue + 80, `delayed recipe: no overflow line at 448 / ${line.scale}: ${line.pixel}`);
  await screenshot(delayed, 'tensor_fp8_delayed');
  await delayed.close();
  return `${listed.length} quantisers listed; binade 2^${band.full} normal in ${band.normal} of ${band.blocks} blocks`;
}

async function checkComparePage(browser, base) {
  const page = await openPage(browser);
  await loadPage(page, `${base}/compare?a=demo&b=short`);
  noErrors(page, 'compare page');
  for (const name of ['compare_loss', 'compare_scale', 'compare_underflow']) {
    check(await page.$(`[data-chart="${name}"] canvas`), `compare page: nothing drawn in ${name}`);
  }
  const labels = await page.$$eval('[data-chart="compare_loss"] .u-legend .u-label', (n) => n.map((x) => x.textContent));
  check(labels.some((l) => l.startsWith('demo')) && labels.some((l) => l.startsWith('short')),
        `compare page: the loss legend names ${labels}`);
  await screenshot(page, 'compare');
  await page.close();
}

// A run still training: its page redraws without a reload as reports arrive.
async function checkLive(browser, base, grpc) {
  const live = train(grpc, 'live', 5000, ['--eval-every', '0']);
  for (let i = 0; ; i += 1) {
    const { status, body } = await api(base, '/api/runs/live');
    if (status === 200 && body.run.last_step >= 3) break;
    check(live.exitCode === null, `ampscope-train live ended early:\n${logTail('train-live')}`);
    check(i < 300, 'the live run sent nothing for 30 s');
    await sleep(100);
  }
  const runs = await openPage(browser);
  await loadPage(runs, `${base}/`);
  const status = await runs.$$eval('table[data-table="runs"] tbody tr', (rows) =>
    rows.filter((r) => r.cells[0].textContent === 'live').map((r) => r.cells[1].textContent));
  check(status[0] === 'training', `runs page: the live run's status is ${status}, expected training`);
  noErrors(runs, 'runs page with a live run');
  await screenshot(runs, 'runs');
  await runs.close();

  const page = await openPage(browser);
  await loadPage(page, `${base}/runs/live`);
  const read = () => page.evaluate(() => ({
    updates: Number(document.body.dataset.updates || 0),
    last: Number(document.querySelector('[data-fact="last_step"]').textContent.replace(/,/g, '')),
  }));
  const first = await read();
  let now = first;
  for (let i = 0; i < 100 && !(now.updates >= 2 && now.last > first.last); i += 1) {
    await sleep(200);
    now = await read();
  }
  check(now.updates >= 2 && now.last > first.last,
        `live run page: ${now.updates} updates, last step ${first.last} -> ${now.last} in 20 s`);
  noErrors(page, 'live run page');
  await screenshot(page, 'live');
  await page.close();
  await stop(live);
  return [first.last, now.last, now.updates];
}

// The same store behind a reader token: the API refuses a request without it, the login form
// refuses a wrong token (401, "token refused") and lets the right one in.
async function checkLogin(browser) {
  const tokens = path.join(WORK, 'tokens');
  fs.writeFileSync(tokens, `reader ${READER_TOKEN}\n`, { mode: 0o600 });
  const server = await startServer('server-tokens', ['--auth-token-file', tokens]);
  const base = server.base;
  check((await api(base, '/api/runs')).status === 401, '/api/runs without a token: expected 401');
  check((await api(base, '/api/runs', { Authorization: `Bearer ${READER_TOKEN}` })).status === 200,
        '/api/runs with the reader token as a bearer: expected 200');

  const context = await browser.createBrowserContext();
  const page = await openPage(context);
  await page.goto(`${base}/runs/demo`);
  check(new URL(page.url()).pathname === '/login', `without a session /runs/demo should lead to /login, not ${page.url()}`);
  await page.type('input[name="token"]', 'not-the-token');
  const [refused] = await Promise.all([page.waitForNavigation(), page.click('button[type="submit"]')]);
  check(refused.status() === 401, `a wrong token: expected 401, got ${refused.status()}`);
  check((await page.content()).includes('token refused'), 'a wrong token: the form does not say "token refused"');
  await screenshot(page, 'login_refused');
  await page.type('input[name="token"]', READER_TOKEN);
  await Promise.all([page.waitForNavigation(), page.click('button[type="submit"]')]);
  check(new URL(page.url()).pathname === '/runs/demo', `after login: at ${page.url()}, expected /runs/demo`);
  await page.waitForSelector('body[data-ready="1"]');
  const signedIn = await openPage(context);
  await loadPage(signedIn, `${base}/runs/demo`);
  noErrors(signedIn, 'run page after login');
  check(await signedIn.$('table[data-table="offenders"] tbody tr'), 'run page after login: no offender row');
  await context.close();
  await stop(server.child);
}

async function main() {
  fs.mkdirSync(SHOTS, { recursive: true });
  const server = await startServer('server');
  log(`server up: grpc ${server.grpc}, http ${server.base}`);
  await trainToEnd(server.grpc, 'demo', 200, ['--init-scale', '16777216', '--inject-nan', 'h0.mlp.fc@60',
                                               '--eval-every', '100']);
  log('demo run trained (200 steps)');
  await trainToEnd(server.grpc, 'short', 40, ['--eval-every', '20']);
  log('short run trained (40 steps)');
  await trainToEnd(server.grpc, 'tiny', 4, ['--eval-every', '0']);
  log('tiny run trained (4 steps)');
  await trainToEnd(server.grpc, 'fp4', 6, ['--eval-every', '0', '--bf16-gemm', 'h1.mlp.fc', '--loss-cost-every', '2'],
                   'nvfp4');
  await trainToEnd(server.grpc, 'fp8', 6, ['--eval-every', '0'], 'fp8-delayed');
  log('nvfp4 and fp8-delayed runs trained (6 steps each)');
  const browser = await launchBrowser(NODE_MODULES);
  try {
    await checkRunsPage(browser, server.base);
    log('runs page: ok');
    await checkRunPage(browser, server.base);
    log('run page: ok (offender, skip and decision markers, hover, zoom, offender link to the heatmap)');
    const [columns, recorded] = await checkTensorPage(browser, server.base);
    log(`tensor page: ok (${columns} columns drawn; after unscaling, with the flight recorder's: ${recorded})`);
    log(`4-step run: whole-step ticks (${await checkShortRunAxes(browser, server.base)})`);
    await checkComparePage(browser, server.base);
    log('compare page: ok');
    log(`quantisers: ok (${await checkQuantizerPages(browser, server.base)})`);
    const [from, to, updates] = await checkLive(browser, server.base, server.grpc);
    log(`live: ok (last step ${from} -> ${to} after ${updates} updates, no reload)`);
    await stop(server.child);
    await checkLogin(browser);
    log('login: ok (wrong token refused with 401, reader token signed in)');
  } finally {
    await browser.close();
  }
  log(`passed; screenshots in ${SHOTS}`);
}

try {
  await main();
  fs.rmSync(WORK, { recursive: true, force: true });
} catch (error) {
  console.error(`FAILED: ${error.message}`);
  console.error(`(logs kept in ${WORK})`);
  for (const child of children) child.kill('SIGKILL');
  process.exit(1);
}
for (const child of children) child.kill('SIGKILL');
