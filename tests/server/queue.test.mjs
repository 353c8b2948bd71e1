// More concurrent requests than running slots, all sent at once: every one is answered. Equal lengths make
// the sequences that start together finish in the same iteration, leaving none running while the rest wait;
// the scheduler must start those without a new request to wake it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, metrics, MODEL_NAME } from './harness.mjs';

const N = 30;
const MAX_TOKENS = 300;
let server;
let client;

before(async () => {
  server = await startServer(['--parallel', '4', '--queue', '64', '-t', '1']);
  // A stalled server never answers: fail in seconds, not at the runner's timeout.
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 30000 });
});

after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

const params = (i) => ({
  model: MODEL_NAME, prompt: `Once upon a time ${i}`, max_tokens: MAX_TOKENS, temperature: 1, ignore_eos: true,
});

async function idle() {
  const m = await metrics(server.url);
  assert.equal(m.tandem_queue_depth, 0);
  assert.equal(m.tandem_running_sequences, 0);
}

test(`${N} concurrent completions on 4 slots are all answered`, async () => {
  const answers = await Promise.all(Array.from({ length: N }, (_, i) => client.completions.create(params(i))));
  for (const r of answers) {
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, MAX_TOKENS);
  }
  await idle();
});

test(`${N} concurrent streams on 4 slots all finish`, async () => {
  const one = async (i) => {
    let tokens = 0;
    let finish = null;
    const stream = await client.completions.create({ ...params(i), stream: true, stream_options: { include_usage: true } });
    for await (const chunk of stream) {
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      for (const c of chunk.choices) finish = c.finish_reason ?? finish;
    }
    return { tokens, finish };
  };
  const results = await Promise.all(Array.from({ length: N }, (_, i) => one(i)));
  for (const r of results) assert.deepEqual(r, { tokens: MAX_TOKENS, finish: 'length' });
  await idle();
});
