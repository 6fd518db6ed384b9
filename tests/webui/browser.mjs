// Debian's chromium, headless, driven by puppeteer-core: what the web UI test and the page-load
// benchmark share. launchBrowser() finds chromium on PATH (null when it is missing); openPage()
// records each page's console errors and uncaught exceptions, so a caller can assert that a
// page loaded cleanly.
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';

export function findChromium() {
  for (const name of ['chromium', 'chromium-browser']) {
    try {
      return execFileSync('which', [name], { encoding: 'utf8' }).trim() || null;
    } catch { /* not this one */ }
  }
  return null;
}

// node_modules: the folder holding puppeteer-core (server/webui/node_modules).
export function loadPuppeteer(node_modules) {
  const require = createRequire(path.join(path.resolve(node_modules), 'noop.js'));
  return require('puppeteer-core');
}

export async function launchBrowser(node_modules, { width = 1360, height = 900 } = {}) {
  const executablePath = findChromium();
  if (!executablePath) throw new Error('chromium is not installed (Debian package chromium)');
  const puppeteer = loadPuppeteer(node_modules);
  const args = ['--disable-gpu', '--disable-dev-shm-usage', '--no-first-run', '--hide-scrollbars'];
  if (process.getuid && process.getuid() === 0) args.push('--no-sandbox');
  return puppeteer.launch({
    executablePath, headless: true, args, defaultViewport: { width, height, deviceScaleFactor: 1 },
  });
}

// A new tab whose errors are collected in page.errors: console messages of type "error" (a
// failed resource, a CSP violation, console.error) and uncaught exceptions.
export async function openPage(browser, { headers } = {}) {
  const page = await browser.newPage();
  page.errors = [];
  page.on('console', (message) => {
    if (message.type() === 'error') {
      const where = message.location() && message.location().url ? ` (${message.location().url})` : '';
      page.errors.push(`console: ${message.text()}${where}`);
    }
  });
  page.on('pageerror', (error) => page.errors.push(`exception: ${error.message}`));
  if (headers) await page.setExtraHTTPHeaders(headers);
  return page;
}

// Loads url and waits until the page says its data is drawn (body[data-ready="1"]).
export async function loadPage(page, url, { timeout = 15000 } = {}) {
  const started = performance.now();
  await page.goto(url, { waitUntil: 'load', timeout });
  await page.waitForSelector('body[data-ready="1"]', { timeout });
  return (performance.now() - started) / 1000;
}
