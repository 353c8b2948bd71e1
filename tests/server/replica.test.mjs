// What a load balancer reads from one server: /health's states (starting, ok, busy, draining) with
// Retry-After, the X-Tandem-Replica header on every response, and the OpenAI user field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, sleep, metrics, MODEL_NAME } from './harness.mjs';

let server;

before(async () => {
  server = await startServer(['--parallel', '1', '--queue', '0', '-c', '16384', '-t', '1', '--replica-name', 'r7',
    '--drain-timeout', '2']);
});

after(async () => {
  if (server.proc.exitCode === null) await server.stop();
});

async function health() {
  const res = await fetch(`${server.url}/health`);
  return { status: res.status, retry: res.headers.get('retry-after'), replica: res.headers.get('x-tandem-replica'),
    body: await res.json() };
}

test('the server warms up before it calls itself ready', () => {
  const log = server.log();
  const warming = log.indexOf("serve: replica 'r7' warming up");
  assert.ok(warming >= 0, log);
  assert.ok(warming < log.indexOf('listening on'), log);
});

test('every response names the replica', async () => {
  assert.deepEqual(await health(), { status: 200, retry: null, replica: 'r7', body: { status: 'ok', replica: 'r7' } });
  for (const [path, status] of [['/v1/models', 200], ['/metrics', 200], ['/nowhere', 404]]) {
    const res = await fetch(`${server.url}${path}`);
    assert.equal(res.status, status, path);
    assert.equal(res.headers.get('x-tandem-replica'), 'r7', path);
  }
});

test('the user field must be a string', async () => {
  const post = (user) => fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'x-session-id': 'abc' },
    body: JSON.stringify({ model: MODEL_NAME, prompt: 'Hi', max_tokens: 1, user }),
  });
  const bad = await post(42);
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.param, 'user');
  const good = await post('alice');
  assert.equal(good.status, 200, await good.text());
});

// The embedding queue holds --parallel + --queue requests (here one): a long embedding runs, a second waits,
// and /health is busy until they are done, as it is for generation.
test('/health turns busy while the embedding queue is full', async () => {
  const embed = (n) => fetch(`${server.url}/v1/embeddings`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_NAME, input: Array.from({ length: n }, (_, i) => 3 + ((i * 37) % 500)) }),
  });
  const first = embed(2500);
  let second = null;
  let h;
  const t0 = Date.now();
  for (;;) {
    // The second request goes once the first has left the queue for its batch.
    if (!second && (await metrics(server.url)).tandem_embedding_queue_depth === 0 && Date.now() - t0 > 100) {
      second = embed(8);
    }
    h = await health();
    if (h.body.status === 'busy') break;
    assert.ok(Date.now() - t0 < 10000, `the embedding queue fills within 10 s: ${JSON.stringify(h)}`);
    await sleep(5);
  }
  assert.deepEqual(h, {
    status: 503, retry: '1', replica: 'r7', body: {
      status: 'busy', replica: 'r7', queues: {
        generation: { full: false, running: 0, waiting: 0, max_running: 1, max_waiting: 0 },
        embeddings: { full: true, waiting: 1, max_waiting: 1 },
      },
    },
  });
  const refused = await embed(4);
  assert.equal(refused.status, 503);
  assert.equal((await refused.json()).error.code, 'server_overloaded');
  for (const r of [await first, await second]) assert.equal(r.status, 200, await r.text());
  assert.equal((await health()).body.status, 'ok');
});

test('/health turns busy while the queue is full, then draining after SIGTERM', async () => {
  const long = fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 15000, ignore_eos: true }),
  });
  const t0 = Date.now();
  while ((await metrics(server.url)).tandem_running_sequences !== 1) {
    assert.ok(Date.now() - t0 < 10000, 'the long request runs within 10 s');
    await sleep(20);
  }
  // One slot, no queue: a new request would be refused, and /health says so before it is sent, with the
  // depths and bounds of both queues.
  assert.deepEqual(await health(), {
    status: 503, retry: '1', replica: 'r7', body: {
      status: 'busy', replica: 'r7', queues: {
        generation: { full: true, running: 1, waiting: 0, max_running: 1, max_waiting: 0 },
        embeddings: { full: false, waiting: 0, max_waiting: 1 },
      },
    },
  });
  server.proc.kill('SIGTERM');
  const t1 = Date.now();
  let h;
  do {
    h = await health();
    assert.ok(Date.now() - t1 < 2000, 'draining within 2 s');
  } while (h.body.status !== 'draining');
  assert.deepEqual(h, { status: 503, retry: '1', replica: 'r7', body: { status: 'draining', replica: 'r7' } });
  await (await long).text();
});
