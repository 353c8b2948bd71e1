// Authentication, the bounded queue (503 with Retry-After) and draining on SIGTERM, on a server with one
// running slot and one queue place.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import OpenAI from 'openai';
import { startServer, sleep, BIN, MODEL, MODEL_NAME } from './harness.mjs';

const KEY = 'test-key-123';
let server;

before(async () => {
  // One thread: a pool's spinning workers slow to a crawl when the machine's cores are oversubscribed, and the
  // drain test needs its running request to finish within the drain timeout.
  server = await startServer(['-c', '16384', '--parallel', '1', '--queue', '1', '--api-key', KEY, '-t', '1']);
});

after(async () => {
  if (server.proc.exitCode === null) await server.stop();
});

const auth = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
const long = (extra = {}) => JSON.stringify({
  model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 2000, ignore_eos: true, stream: true, ...extra,
});

test('an API key is required everywhere but /health', async () => {
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
  for (const headers of [{}, { authorization: 'Bearer wrong' }, { authorization: KEY }]) {
    const res = await fetch(`${server.url}/v1/models`, { headers });
    assert.equal(res.status, 401);
    assert.equal(typeof (await res.json()).error.message, 'string');
  }
  const bad = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  const good = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
  assert.equal((await good.models.list()).data[0].id, MODEL_NAME);
});

test('a second server on a port in use is refused, and the first keeps it', async () => {
  const second = spawn(BIN, ['serve', '-m', MODEL, '-t', '1', '--port', String(server.port)], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  second.stderr.on('data', (d) => { log += d.toString(); });
  const killer = setTimeout(() => second.kill('SIGKILL'), 60000);
  const code = await new Promise((resolve) => second.on('exit', (c) => resolve(c)));
  clearTimeout(killer);
  assert.notEqual(code, 0, log);
  assert.match(log, /cannot listen on 127\.0\.0\.1:\d+/);
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
});

test('past the running slots and the queue: 503 with Retry-After', async () => {
  const controllers = [];
  const send = (body) => {
    const c = new AbortController();
    controllers.push(c);
    return fetch(`${server.url}/v1/completions`, { method: 'POST', headers: auth, body, signal: c.signal });
  };
  // In order, each step confirmed before the next: the first request runs (its first chunk arrived), the
  // second waits in the queue, the next two are refused. The first cannot finish meanwhile: it asks for
  // far more tokens than the test takes.
  const first = await send(long({ max_tokens: 16000 }));
  assert.equal(first.status, 200);
  await first.body.getReader().read();
  const second = await send(long());
  assert.equal(second.status, 200);
  const refused = await Promise.all([0, 1].map(async () => {
    const res = await send(long());
    return { status: res.status, retry: res.headers.get('retry-after'), body: await res.json() };
  }));
  for (const r of refused) {
    assert.equal(r.status, 503, JSON.stringify(r.body));
    assert.ok(Number(r.retry) >= 1);
    assert.equal(typeof r.body.error.message, 'string');
  }
  for (const c of controllers) c.abort();
  // Both slots come back: a new request is served.
  for (let i = 0; ; ++i) {
    const res = await fetch(`${server.url}/v1/completions`, {
      method: 'POST', headers: auth, body: JSON.stringify({ model: MODEL_NAME, prompt: 'Hi', max_tokens: 2 }),
    });
    if (res.status === 200) break;
    assert.ok(i < 100, 'the aborted requests still hold the server after 5 s');
    await res.text();
    await sleep(50);
  }
});

test('SIGTERM drains: running requests finish, new ones are refused, exit 0', async () => {
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: auth, body: long({ max_tokens: 400 }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let sse = decoder.decode((await reader.read()).value);
  server.proc.kill('SIGTERM');
  await sleep(200);
  const refused = await fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: auth, body: JSON.stringify({ model: MODEL_NAME, prompt: 'Hi', max_tokens: 2 }),
  }).then((r) => r.status, () => 'refused');
  assert.ok(refused === 503 || refused === 'refused', `a request after SIGTERM got ${refused}`);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    sse += decoder.decode(value);
  }
  assert.ok(sse.trimEnd().endsWith('data: [DONE]'), sse.slice(-200));
  assert.match(sse, /"finish_reason":"length"/);
  const { code } = await server.exited;
  assert.equal(code, 0, server.log());
});
