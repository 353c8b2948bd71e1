// Continuation text through the server: for every record of the two real models' goldens
// (../shared/golden/*.public.jsonl), /v1/completions returns greedy_text exactly, streamed or not (the first
// delta carries the continuation's leading space), the empty prompt generates from the start of text, and
// stop sequences and logprobs see the leading space. A model that adds no BOS refuses the empty prompt with a
// message saying what to do; chat replies keep starting without a space.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, SHARED } from './harness.mjs';

const REAL = [
  { golden: 'stories260K', model: path.join(SHARED, 'models', 'stories260K.gguf') },
  { golden: 'llama2xs', model: path.join(SHARED, 'models', 'llama2xs-tok512.gguf') },
];
const NO_BOS_MODEL = path.join(SHARED, 'models', 'synth', 'synth-qwen2-d64-Q8_0.gguf');

function records(golden) {
  const file = path.join(SHARED, 'golden', `${golden}.public.jsonl`);
  return fs.readFileSync(file, 'utf8').split('\n').filter((l) => l).map((l) => JSON.parse(l));
}

// One server per model, started on first use and shared by the tests.
const servers = new Map();
async function serve(model) {
  if (!servers.has(model)) {
    const server = await startServer([], model);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
    const name = (await client.models.list()).data[0].id;
    servers.set(model, { server, client, name });
  }
  return servers.get(model);
}

after(async () => {
  for (const { server } of servers.values()) {
    const { code } = await server.stop();
    assert.equal(code, 0, `the server should exit 0 after SIGTERM:\n${server.log()}`);
  }
});

async function streamed(client, params) {
  const stream = await client.completions.create({ ...params, stream: true });
  const deltas = [];
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.text) deltas.push(c.text);
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { deltas, finish };
}

for (const { golden, model } of REAL) {
  test(`${golden}: completions return greedy_text for every golden record`, async () => {
    const { client, name } = await serve(model);
    const recs = records(golden);
    assert.ok(recs.length > 0);
    assert.ok(recs.some((r) => r.prompt === ''), 'the goldens hold the empty prompt');
    let spaced = 0;
    for (const rec of recs) {
      const what = `${golden}: ${JSON.stringify(rec.prompt.slice(0, 40))}`;
      const params = { model: name, prompt: rec.prompt, max_tokens: rec.greedy_ids.length, temperature: 0 };
      const whole = await client.completions.create({ ...params, logprobs: 1 });
      const choice = whole.choices[0];
      assert.equal(choice.text, rec.greedy_text, what);
      assert.equal(whole.usage.prompt_tokens, rec.prompt_ids.length, what);
      // Logprob tokens are the pieces; with the space kept they join into the text, offsets from 0.
      assert.equal(choice.logprobs.tokens.join(''), rec.greedy_text, what);
      assert.equal(choice.logprobs.text_offset[0], 0, what);

      const s = await streamed(client, params);
      assert.equal(s.deltas.join(''), rec.greedy_text, what);
      assert.equal(s.finish, choice.finish_reason, what);
      assert.ok(rec.greedy_text.startsWith(s.deltas[0]), what);
      if (rec.greedy_text.startsWith(' ')) {
        ++spaced;
        assert.ok(s.deltas[0].startsWith(' '), `${what}: the first delta must carry the leading space`);
        // The leading space takes part in stop sequences: a stop at it sends nothing.
        const cut = await client.completions.create({ ...params, stop: [' '] });
        assert.equal(cut.choices[0].text, '', what);
        assert.equal(cut.choices[0].finish_reason, 'stop', what);
      }
    }
    assert.ok(spaced >= 4, `only ${spaced} records begin with a space`);
  });
}

test('the empty prompt, as a string or in an array, generates from the start of text', async () => {
  const { client, name } = await serve(REAL[0].model);
  const rec = records(REAL[0].golden).find((r) => r.prompt === '');
  for (const prompt of ['', ['']]) {
    const params = { model: name, prompt, max_tokens: rec.greedy_ids.length, temperature: 0 };
    const r = await client.completions.create(params);
    assert.equal(r.choices[0].text, rec.greedy_text);
    assert.equal(r.usage.prompt_tokens, 1);  // BOS alone
  }
  // Chat is unaffected: a reply is a message of its own and starts without the space.
  const chat = await client.chat.completions.create({
    model: name, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 8, temperature: 0,
  });
  assert.ok(chat.choices[0].message.content.length > 0);
  assert.ok(!chat.choices[0].message.content.startsWith(' '), chat.choices[0].message.content);
});

test('a model that adds no BOS refuses the empty prompt, saying what to do', async () => {
  const { server, name } = await serve(NO_BOS_MODEL);
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: name, prompt: '', max_tokens: 4 }),
  });
  assert.equal(res.status, 400);
  const body = await res.json();
  assert.equal(body.error.param, 'prompt');
  assert.match(body.error.message, /non-empty prompt/);
  // The server still serves.
  const ok = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: name, prompt: 'Hello', max_tokens: 4, temperature: 0 }),
  });
  assert.equal(ok.status, 200);
});
