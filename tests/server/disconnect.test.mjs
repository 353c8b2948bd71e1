// Clients of non-streamed requests that leave, and clients that only half-close: a closed connection frees
// its sequence (running or queued) within moments; a client that sent its request and then shut down its
// sending side (socket.end(), shutdown(SHUT_WR)) still reads the whole answer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import OpenAI from 'openai';
import { startServer, metrics, sleep, MODEL_NAME } from './harness.mjs';

let server;
let client;

before(async () => {
  server = await startServer(['--parallel', '1', '--queue', '4', '-c', '16384', '-t', '1']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

// A request written on a raw socket. halfClose: end the sending side right after it. Resolves the socket and
// a promise of everything the server sends until it closes.
function rawRequest(body, { halfClose = false } = {}) {
  const socket = net.connect(server.port, '127.0.0.1');
  const received = new Promise((resolve) => {
    const chunks = [];
    socket.on('data', (d) => chunks.push(d));
    socket.on('close', () => resolve(Buffer.concat(chunks).toString()));
    socket.on('error', () => {});
  });
  const text = JSON.stringify(body);
  socket.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${Buffer.byteLength(text)}\r\n\r\n${text}`);
  if (halfClose) socket.end();
  return { socket, received };
}

// The final response of raw HTTP/1.1 bytes, skipping interim 1xx responses.
function finalResponse(raw) {
  let rest = raw;
  for (;;) {
    const end = rest.indexOf('\r\n\r\n');
    const m = rest.match(/^HTTP\/1\.1 (\d{3})/);
    assert.ok(m && end > 0, `not an HTTP response: ${JSON.stringify(raw.slice(0, 300))}`);
    const status = Number(m[1]);
    const head = rest.slice(0, end);
    rest = rest.slice(end + 4);
    if (status >= 200) return { status, head, body: rest };
  }
}

async function waitFor(what, ms, fn) {
  const t0 = Date.now();
  for (;;) {
    const m = await metrics(server.url);
    if (fn(m)) return m;
    assert.ok(Date.now() - t0 < ms, `${what} within ${ms} ms: ${JSON.stringify(m)}`);
    await sleep(20);
  }
}

const cancelled = (m) => m['tandem_finished_requests_total{reason="cancelled"}'] ?? 0;
const long = { model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 15000, ignore_eos: true };

test('a half-closed client still gets its answer', async () => {
  const params = { model: MODEL_NAME, prompt: 'The little dog', max_tokens: 24, temperature: 0, ignore_eos: true };
  const expected = await client.completions.create(params);
  const { received } = rawRequest(params, { halfClose: true });
  const res = finalResponse(await received);
  assert.equal(res.status, 200, res.body);
  const body = JSON.parse(res.body);
  assert.equal(body.choices[0].text, expected.choices[0].text);
  assert.equal(body.usage.completion_tokens, 24);
});

test('a half-closed client gets its error too', async () => {
  const { received } = rawRequest({ model: MODEL_NAME, prompt: 'x', max_tokens: 0 }, { halfClose: true });
  const res = finalResponse(await received);
  assert.equal(res.status, 400, res.body);
  assert.equal(typeof JSON.parse(res.body).error.message, 'string');
});

test('a non-streamed request whose client closed is cancelled', async () => {
  const m0 = await metrics(server.url);
  const { socket } = rawRequest(long);
  await waitFor('the request starts', 10000, (m) => m.tandem_running_sequences === 1);
  socket.destroy();
  const m1 = await waitFor('the sequence is freed', 3000,
    (m) => cancelled(m) === cancelled(m0) + 1 && m.tandem_running_sequences === 0);
  assert.ok(m1.tandem_generated_tokens_total - m0.tandem_generated_tokens_total < 15000);
});

test('a queued non-streamed request whose client closed leaves the queue', async () => {
  const m0 = await metrics(server.url);
  const running = new AbortController();
  const first = await fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...long, stream: true }),
    signal: running.signal,
  });
  await first.body.getReader().read();
  const { socket } = rawRequest(long);
  await waitFor('the second request is queued', 5000, (m) => m.tandem_queue_depth === 1);
  socket.destroy();
  await waitFor('the queue empties', 3000, (m) => m.tandem_queue_depth === 0 && cancelled(m) === cancelled(m0) + 1);
  assert.equal((await metrics(server.url)).tandem_running_sequences, 1, 'the first request runs on');
  running.abort();
  await waitFor('the first is cancelled too', 3000, (m) => m.tandem_running_sequences === 0);
});
