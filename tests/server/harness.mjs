// Starts `tandem serve` on a free loopback port and stops it; shared by the server tests.
import { spawn } from 'node:child_process';
import path from 'node:path';

export const BIN = process.env.TANDEM_BIN;
export const SHARED = process.env.TANDEM_SHARED;
if (!BIN || !SHARED) throw new Error('TANDEM_BIN and TANDEM_SHARED must be set (use tests/server/run.sh)');
export const MODEL = path.join(SHARED, 'models', 'stories260K.gguf');
export const MODEL_NAME = 'stories260K';

// Resolves once the server prints its port; rejects if it exits first or takes over 60 s.
export function startServer(extraArgs = [], model = MODEL) {
  const args = ['serve', '-m', model, '--port', '0', '-t', '2', ...extraArgs];
  const proc = spawn(BIN, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const ready = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in 60 s:\n${log}`)), 60000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`server exited (code ${code}, signal ${signal}) before listening:\n${log}`));
    });
  });
  return ready.then((port) => ({
    proc,
    port,
    url: `http://127.0.0.1:${port}`,
    log: () => log,
    exited,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      const killer = setTimeout(() => proc.kill('SIGKILL'), 30000);
      const r = await exited;
      clearTimeout(killer);
      return r;
    },
  }));
}

// Parses Prometheus text into { 'name{labels}': value }.
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

export async function metrics(url, headers = {}) {
  const res = await fetch(`${url}/metrics`, { headers });
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}`);
  return parseMetrics(await res.text());
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
