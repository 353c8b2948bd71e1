// SIGTERM with requests queued behind a running one: the queued ones are refused at once (503 with
// Retry-After; an error event with a retry field on a stream, whose 200 was already sent), the running one
// runs until the drain timeout and then ends with finish_reason "cancelled", and the server exits 0.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, metrics, sleep, MODEL_NAME } from './harness.mjs';

const DRAIN_SECONDS = 3;
let server;
let client;

before(async () => {
  server = await startServer(['--parallel', '1', '--queue', '4', '-c', '16384', '-t', '1',
    '--drain-timeout', String(DRAIN_SECONDS)]);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  if (server.proc.exitCode === null) await server.stop();
});

const long = { model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 15000, ignore_eos: true };

async function waitFor(what, ms, fn) {
  const t0 = Date.now();
  for (;;) {
    const m = await metrics(server.url);
    if (fn(m)) return m;
    assert.ok(Date.now() - t0 < ms, `${what} within ${ms} ms`);
    await sleep(20);
  }
}

async function sseText(res) {
  let text = '';
  const decoder = new TextDecoder();
  for await (const chunk of res.body) text += decoder.decode(chunk, { stream: true });
  return text;
}

test('SIGTERM refuses queued requests with 503 and cuts the running one as cancelled', async () => {
  const running = client.completions.create(long);
  await waitFor('the first request runs', 10000, (m) => m.tandem_running_sequences === 1);
  const queuedWhole = fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...long, max_tokens: 5 }),
  });
  const queuedStream = await fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...long, max_tokens: 5, stream: true }),
  });
  assert.equal(queuedStream.status, 200);
  await waitFor('both are queued', 5000, (m) => m.tandem_queue_depth === 2);

  const t0 = Date.now();
  server.proc.kill('SIGTERM');
  const whole = await queuedWhole;
  const refusedAfter = Date.now() - t0;
  assert.equal(whole.status, 503);
  assert.ok(Number(whole.headers.get('retry-after')) >= 1, 'Retry-After');
  assert.equal((await whole.json()).error.code, 'server_shutting_down');
  assert.ok(refusedAfter < DRAIN_SECONDS * 1000, `a queued request waited ${refusedAfter} ms for its 503`);

  const sse = await sseText(queuedStream);
  assert.match(sse, /^retry: \d+$/m);
  const events = sse.split('\n\n').filter((e) => e.includes('data: '))
    .map((e) => e.slice(e.indexOf('data: ') + 6));
  assert.equal(events.at(-1), '[DONE]');
  assert.equal(JSON.parse(events[0]).error.code, 'server_shutting_down', sse);
  assert.ok(!sse.includes('"finish_reason"'), sse);

  const r = await running;
  assert.equal(r.choices[0].finish_reason, 'cancelled');
  assert.ok(r.usage.completion_tokens < 15000);
  assert.ok(Date.now() - t0 >= DRAIN_SECONDS * 1000 - 100, 'the running request had the drain timeout');
  const { code } = await server.exited;
  assert.equal(code, 0, server.log());
});
