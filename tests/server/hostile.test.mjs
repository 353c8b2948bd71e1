// Hostile clients against one server while 8 valid streams run: deep JSON, oversized and chunked bodies,
// overflowing numbers, too many or too large headers, idle, half-sent and drip-fed connections, and more
// connections than the server takes. Every bad request must get a 4xx (or the 503 of a full server) with an
// error object naming the problem; /health and new requests stay answered; no valid stream is lost; the
// resident size stays bounded during the load and comes back near its steady state after it. Loopback only,
// modest counts, every loop bounded.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import http from 'node:http';
import fs from 'node:fs';
import { startServer, sleep, MODEL_NAME } from './harness.mjs';

const MAX_BODY = 4 << 20;
const MAX_CONNECTIONS = 160;
const REQUEST_TIMEOUT_S = 3;
const IDLE_TIMEOUT_S = 2;
let server;

before(async () => {
  server = await startServer([
    '-c', '2048', '--parallel', '10', '--queue', '16', '--max-body', String(MAX_BODY),
    '--max-connections', String(MAX_CONNECTIONS), '--request-timeout', String(REQUEST_TIMEOUT_S),
    '--idle-timeout', String(IDLE_TIMEOUT_S), '--max-headers', '50', '--max-header-bytes', '16384',
  ]);
});

after(async () => {
  stopValid = true;
  await Promise.all(validLoops);
  const { code } = await server.stop();
  assert.equal(code, 0, `the server should exit 0 after SIGTERM:\n${server.log().slice(-2000)}`);
});

// kB of the server's resident set now (VmRSS) and at its peak (VmHWM).
function rss() {
  const status = fs.readFileSync(`/proc/${server.proc.pid}/status`, 'utf8');
  const kb = (key) => Number(status.match(new RegExp(`${key}:\\s+(\\d+) kB`))[1]);
  return { now: kb('VmRSS'), peak: kb('VmHWM') };
}

// Eight streams, each requested again as soon as it ends, until the suite is over; the server runs ten, so
// that a new request has a free slot.
let stopValid = false;
const valid = { done: 0, retried: 0, lost: [] };
const validLoops = [];
async function validLoop(i) {
  while (!stopValid) {
    try {
      const res = await fetch(`${server.url}/v1/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL_NAME, prompt: `Once upon a time ${i}`, max_tokens: 40,
          ignore_eos: true, stream: true }),
      });
      const text = await res.text();
      if (res.status === 503 && res.headers.get('retry-after')) {  // a full server; a client retries
        ++valid.retried;
        await sleep(200);
        continue;
      }
      if (res.status !== 200 || !text.trimEnd().endsWith('data: [DONE]') || !text.includes('"length"'))
        valid.lost.push(`${res.status}: ${text.slice(-200)}`);
      else ++valid.done;
    } catch (e) {
      valid.lost.push(`${e.message} ${e.cause?.code ?? ''}`);
    }
  }
}

// Sends raw bytes on a fresh connection and collects everything until the server closes it (or `ms`).
function raw(bytes, ms = 15000) {
  return new Promise((resolve) => {
    const sock = net.connect(server.port, '127.0.0.1');
    let data = '';
    const timer = setTimeout(() => { sock.destroy(); resolve({ data, timedOut: true }); }, ms);
    sock.on('connect', () => { if (bytes) sock.write(bytes); });
    sock.on('data', (d) => { data += d.toString(); });
    sock.on('error', () => {});
    sock.on('close', () => { clearTimeout(timer); resolve({ data, timedOut: false }); });
  });
}

function statusOf(response) {
  const m = response.match(/^HTTP\/1\.1 (\d{3})/);
  return m ? Number(m[1]) : null;
}
function errorOf(response) {
  return JSON.parse(response.slice(response.indexOf('\r\n\r\n') + 4)).error;
}

// POSTs a body as chunks of `chunk` bytes (Transfer-Encoding: chunked); resolves with status and body text.
function postChunked(route, chunks) {
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port: server.port, path: route, method: 'POST',
      headers: { 'content-type': 'application/json', 'transfer-encoding': 'chunked' } }, (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({ status: res.statusCode, text }));
    });
    req.on('error', (e) => resolve({ status: null, text: e.message }));
    (async () => {
      for (const c of chunks()) {
        if (req.destroyed) return;
        if (!req.write(c)) await new Promise((r) => req.once('drain', r));
      }
      req.end();
    })();
  });
}

async function expectError(res, status, pattern) {
  const text = typeof res.text === 'function' ? await res.text() : res.text;
  assert.equal(res.status, status, text.slice(0, 300));
  const e = JSON.parse(text).error;
  assert.match(e.message, pattern);
  return e;
}

let steady;

test('8 valid streams run; steady resident size', async () => {
  for (let i = 0; i < 8; ++i) validLoops.push(validLoop(i));
  for (let i = 0; i < 600 && valid.done < 16; ++i) await sleep(50);
  assert.ok(valid.done >= 16, `valid streams are not completing (${valid.done} done in 30 s)`);
  steady = rss().now;
  console.log(`steady resident size ${steady} kB`);
});

test('the Keep-Alive header advertises the idle timeout the server enforces', async () => {
  // A client keeps a pooled connection for the advertised time (less a margin); advertising more than
  // --idle-timeout lets it send a request on a connection the server is closing, and lose it.
  const res = await fetch(`${server.url}/health`);
  await res.text();
  assert.match(res.headers.get('keep-alive') ?? '', new RegExp(`(^|[ ,])timeout=${IDLE_TIMEOUT_S}([ ,]|$)`));
});

test('deep JSON: 4 MB of "[" is a 400 naming the depth limit, 8 at once', async () => {
  const body = '['.repeat(4_000_000);
  const results = await Promise.all(Array.from({ length: 8 }, () => fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body,
  })));
  for (const res of results) await expectError(res, 400, /--max-json-depth/);
});

test('bodies past --max-body are refused, chunked or not; chunked bodies within it are served', async () => {
  await expectError(await fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: 'x'.repeat(MAX_BODY + 1),
  }), 413, /--max-body/);
  // 5 MB of valid JSON, chunked: within the wire allowance, over the decoded limit.
  const big = JSON.stringify({ model: MODEL_NAME, prompt: 'a'.repeat(5 << 20) });
  const over = await postChunked('/v1/completions', function* () {
    for (let i = 0; i < big.length; i += 65536) yield big.slice(i, i + 65536);
  });
  await expectError(over, 413, /--max-body/);
  // 40 MB of '[' in 64 KiB chunks: stopped at the wire allowance, not read to the end into memory.
  const flood = await postChunked('/v1/completions', function* () {
    const chunk = '['.repeat(65536);
    for (let i = 0; i < 640; ++i) yield chunk;
  });
  assert.ok(flood.status === 413 || flood.status === null, `${flood.status} ${flood.text.slice(0, 200)}`);
  if (flood.status === 413) assert.match(JSON.parse(flood.text).error.message, /--max-body/);
  const small = await postChunked('/v1/completions', function* () {
    yield JSON.stringify({ model: MODEL_NAME, prompt: 'Once', max_tokens: 3 });
  });
  assert.equal(small.status, 200, small.text);
  assert.ok(rss().peak < 1.5 * 1024 * 1024, `peak resident size ${rss().peak} kB`);
});

test('numbers past the double range are a 400 naming the field', async () => {
  const cases = [
    [{ temperature: 1e400 }, 'temperature'], [{ top_p: -1e400 }, 'top_p'], [{ min_p: 1e400 }, 'min_p'],
    [{ presence_penalty: 1e400 }, 'presence_penalty'], [{ frequency_penalty: 1e400 }, 'frequency_penalty'],
    [{ logit_bias: { 42: 1e400 } }, 'logit_bias.42'],
  ];
  for (const [extra, param] of cases) {
    // JSON.stringify writes Infinity as null; the overflowing literal goes in by hand.
    const field = Object.keys(extra)[0];
    const literal = field === 'logit_bias' ? '{"42":1e400}' : (extra[field] > 0 ? '1e400' : '-1e400');
    const body = `{"model":"${MODEL_NAME}","prompt":"x","${field}":${literal}}`;
    const res = await fetch(`${server.url}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body,
    });
    const e = await expectError(res, 400, /out of range/);
    assert.equal(e.param, param);
  }
});

test('too many headers or too large a head: 431', async () => {
  const many = Array.from({ length: 60 }, (_, i) => `X-H${i}: ${i}\r\n`).join('');
  let r = await raw(`GET /health HTTP/1.1\r\nHost: x\r\n${many}\r\n`);
  assert.equal(statusOf(r.data), 431, r.data);
  assert.match(errorOf(r.data).message, /--max-headers/);
  r = await raw(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20000)}\r\n\r\n`);
  assert.equal(statusOf(r.data), 431, r.data);
  assert.match(errorOf(r.data).message, /--max-header-bytes/);
  r = await raw(`GET /${'a'.repeat(20000)} HTTP/1.1\r\nHost: x\r\n\r\n`);
  assert.equal(statusOf(r.data), 431, r.data);
});

test('100 held connections: /health and new requests stay quick; slow ones get 408', async () => {
  const held = [];
  // Half-sent requests, idle connections and a drip-feeder.
  for (let i = 0; i < 50; ++i)
    held.push(raw(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"model"`));
  for (let i = 0; i < 49; ++i) held.push(raw(''));
  const drip = new Promise((resolve) => {
    const sock = net.connect(server.port, '127.0.0.1');
    let data = '';
    const line = 'GET /health HTTP/1.1\r\nX-Slow: ' + 'a'.repeat(200);
    let i = 0;
    const timer = setInterval(() => { if (i < line.length) sock.write(line[i++]); }, 200);
    sock.on('data', (d) => { data += d; });
    sock.on('error', () => {});
    sock.on('close', () => { clearInterval(timer); resolve({ data }); });
    setTimeout(() => sock.destroy(), 15000);
  });
  await sleep(300);
  const times = [];
  for (let i = 0; i < 10; ++i) {
    const t0 = performance.now();
    const res = await fetch(`${server.url}/health`);
    assert.equal(res.status, 200);
    await res.text();
    times.push(performance.now() - t0);
  }
  const t0 = performance.now();
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_NAME, prompt: 'Hi', max_tokens: 2 }),
  });
  assert.equal(res.status, 200);
  await res.text();
  const completion = performance.now() - t0;
  times.sort((a, b) => a - b);
  console.log(`/health ${times.map((t) => t.toFixed(1)).join(' ')} ms; completion ${completion.toFixed(1)} ms`);
  assert.ok(times[times.length - 1] < 100, `/health took ${times.map((t) => t.toFixed(0)).join(', ')} ms`);
  assert.ok(completion < 1000, `a new completion took ${completion.toFixed(0)} ms`);

  const results = await Promise.all(held);
  const half = results.slice(0, 50);
  for (const r of half) {
    assert.ok(!r.timedOut, 'a half-sent request was still held after 15 s');
    assert.equal(statusOf(r.data), 408, r.data);
    assert.match(errorOf(r.data).message, /--request-timeout/);
  }
  for (const r of results.slice(50)) assert.ok(!r.timedOut && r.data === '', 'an idle connection was kept');
  const d = await drip;
  assert.equal(statusOf(d.data), 408, d.data);
});

test('past --max-connections: a 503 with Retry-After and an error object', async () => {
  const extra = await Promise.all(Array.from({ length: MAX_CONNECTIONS + 20 }, () => raw('', 10000)));
  const refused = extra.filter((r) => statusOf(r.data) === 503);
  assert.ok(refused.length >= 20, `${refused.length} of ${extra.length} connections were refused`);
  for (const r of refused) {
    assert.match(r.data, /\r\nRetry-After: \d+\r\n/);
    assert.match(errorOf(r.data).message, /--max-connections/);
  }
  for (const r of extra) assert.ok(!r.timedOut, 'a connection was held past the idle timeout');
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
});

test('after the load: no valid stream lost, no crash, memory back near its steady state', async () => {
  const before = valid.done;
  for (let i = 0; i < 400 && valid.done < before + 8; ++i) await sleep(50);
  assert.ok(valid.done >= before + 8,
    `valid streams stopped completing (${valid.done - before} in 20 s; lost: ${valid.lost.join('; ')})`);
  stopValid = true;
  await Promise.all(validLoops);
  assert.deepEqual(valid.lost, []);
  assert.equal(server.proc.exitCode, null, 'the server exited');
  let now = rss().now;
  for (let i = 0; i < 100 && now > 1.5 * steady; ++i) {
    await sleep(100);
    await (await fetch(`${server.url}/health`)).text();
    now = rss().now;
  }
  const { peak } = rss();
  console.log(`resident size ${now} kB after the load, peak ${peak} kB; ${valid.done} valid streams, ` +
    `${valid.retried} retried after a 503`);
  assert.ok(peak < 1.5 * 1024 * 1024, `peak resident size ${peak} kB`);
  assert.ok(now <= 1.5 * steady, `resident size ${now} kB after the load, ${steady} kB before`);
});
