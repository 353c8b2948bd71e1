// The OpenAI API end to end through the official client: completions and chat, streamed and not, batch
// invariance under 16 concurrent streams, the bad-input list, disconnects, and metrics that add up.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, metrics, sleep, MODEL_NAME } from './harness.mjs';

const CTX = 2048;
let server;
let client;

before(async () => {
  server = await startServer(['-c', String(CTX), '--parallel', '8', '--queue', '32', '--max-body', '65536']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, `the server should exit 0 after SIGTERM:\n${server.log()}`);
});

async function streamText(params) {
  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage };
}

test('models and health', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL_NAME]);
  const health = await fetch(`${server.url}/health`);
  assert.equal(health.status, 200);
});

test('completion, not streamed, with logprobs', async () => {
  const r = await client.completions.create({
    model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, logprobs: 3, ignore_eos: true,
  });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.ok(r.choices[0].text.length > 0);
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 8);
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 8);
  assert.equal(lp.token_logprobs.length, 8);
  for (let i = 0; i < 8; ++i) {
    assert.ok(lp.token_logprobs[i] <= 0);
    assert.equal(Object.keys(lp.top_logprobs[i]).length, 3);
    // Greedy: the chosen token is the most likely one.
    assert.equal(Math.max(...Object.values(lp.top_logprobs[i])), lp.token_logprobs[i]);
  }
  assert.equal(lp.tokens.join(''), r.choices[0].text);
});

test('streamed completion equals the whole one', async () => {
  const params = { model: MODEL_NAME, prompt: 'The little dog', max_tokens: 20, temperature: 0.8, seed: 42 };
  const whole = await client.completions.create(params);
  const s = await streamText(params);
  assert.equal(s.text, whole.choices[0].text);
  assert.equal(s.finish, whole.choices[0].finish_reason);
  assert.equal(s.usage.completion_tokens, whole.usage.completion_tokens);
});

test('stop sequences cut the text', async () => {
  const base = { model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 30, temperature: 0, ignore_eos: true };
  const full = (await client.completions.create(base)).choices[0].text;
  const words = full.trim().split(/\s+/);
  assert.ok(words.length > 3, full);
  const stop = ` ${words[2]}`;
  const cut = await client.completions.create({ ...base, stop: [stop] });
  assert.equal(cut.choices[0].text, full.slice(0, full.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, 'stop');
  const streamed = await streamText({ ...base, stop });
  assert.equal(streamed.text, cut.choices[0].text);
});

test('chat, streamed and not', async () => {
  const messages = [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'A cat and a dog' }];
  const r = await client.chat.completions.create({
    model: MODEL_NAME, messages, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  const lps = r.choices[0].logprobs.content;
  assert.ok(lps.length > 0 && lps.length <= r.usage.completion_tokens);
  for (const lp of lps) assert.equal(lp.top_logprobs.length, 2);
  const stream = await client.chat.completions.create({
    model: MODEL_NAME, messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let role = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content ?? '';
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(text, r.choices[0].message.content);
  assert.equal(usage.completion_tokens, r.usage.completion_tokens);
});

const PROMPTS = Array.from({ length: 16 }, (_, i) =>
  ['Once upon a time', 'The sun was', 'Lily and Tom', 'One day a bird'][i % 4] + ' ' + 'big red ball '.repeat(i % 5));

test('16 concurrent greedy streams equal each served alone; metrics add up', async () => {
  const params = (p) => ({ model: MODEL_NAME, prompt: p, max_tokens: 24, temperature: 0, ignore_eos: true });
  const alone = [];
  for (const p of PROMPTS) alone.push(await streamText(params(p)));
  const m0 = await metrics(server.url);
  const together = await Promise.all(PROMPTS.map((p) => streamText(params(p))));
  const m1 = await metrics(server.url);
  for (let i = 0; i < PROMPTS.length; ++i) {
    assert.equal(together[i].text, alone[i].text, `stream ${i} changed when batched`);
    assert.equal(together[i].usage.completion_tokens, 24);
  }
  const delta = (k) => (m1[k] ?? 0) - (m0[k] ?? 0);
  assert.equal(delta('tandem_requests_total{endpoint="/v1/completions",status="200"}'), 16);
  assert.equal(delta('tandem_generated_tokens_total'), together.reduce((s, r) => s + r.usage.completion_tokens, 0));
  assert.equal(delta('tandem_prompt_tokens_total'), together.reduce((s, r) => s + r.usage.prompt_tokens, 0));
  assert.equal(delta('tandem_finished_requests_total{reason="length"}'), 16);
  assert.equal(m1.tandem_running_sequences, 0);
  assert.equal(m1.tandem_queue_depth, 0);
  assert.ok(delta('tandem_forward_rows_sum') >= 16 * 23, 'every decode step was a forward row');
  assert.ok(delta('tandem_forward_rows_count') < 16 * 24, 'rows were batched');
  assert.ok(m1['tandem_forward_rows_bucket{le="+Inf"}'] === m1.tandem_forward_rows_count);
});

// Raw requests with what a broken client could send, and the status each must get.
const BAD = [
  ['POST', '/v1/completions', '{not json', 400],
  ['POST', '/v1/completions', '[1,2,3]', 400],
  ['POST', '/v1/completions', '', 400],
  ['POST', '/v1/completions', Buffer.from('{"model":"stories260K","prompt":"\xff\xfe bad"}', 'latin1'), 400],
  ['POST', '/v1/completions', JSON.stringify({ prompt: 'x' }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: 7, prompt: 'x' }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: 'gpt-5', prompt: 'x' }), 404],
  ['POST', '/v1/completions', JSON.stringify({ model: MODEL_NAME }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: MODEL_NAME, prompt: 'x', max_tokens: 0 }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: MODEL_NAME, prompt: 'x', max_tokens: -1 }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: MODEL_NAME, prompt: 'x', max_tokens: 100000 }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: MODEL_NAME, prompt: 'x', max_tokens: 'many' }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: MODEL_NAME, prompt: 'x', temperature: 'hot' }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: MODEL_NAME, prompt: 'x', stream: 'yes' }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: MODEL_NAME, prompt: Array(2100).fill(5) }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: MODEL_NAME, prompt: 'the cat '.repeat(1500) }), 400],
  ['POST', '/v1/completions', JSON.stringify({ model: MODEL_NAME, prompt: 'x'.repeat(70000) }), 413],
  ['POST', '/v1/chat/completions', JSON.stringify({ model: MODEL_NAME }), 400],
  ['POST', '/v1/chat/completions', JSON.stringify({ model: MODEL_NAME, messages: [{ role: 'user' }, 5] }), 400],
  ['POST', '/v1/chat/completions', JSON.stringify({ model: MODEL_NAME, messages: [{ role: 'x', content: 'y' }] }), 400],
  ['GET', '/v1/completions', null, 405],
  ['DELETE', '/v1/models', null, 405],
  ['GET', '/v1/nothing', null, 404],
  ['POST', '/v2/completions', '{}', 404],
];

async function sendBad([method, route, body, status]) {
  let res;
  try {
    res = await fetch(`${server.url}${route}`, {
      method, body: body ?? undefined, headers: body ? { 'content-type': 'application/json' } : {},
    });
  } catch (e) {
    // Say which request failed and why (the connection's own error), not just "fetch failed".
    throw new Error(`${method} ${route} (${body ? String(body.length) : 'no'} body bytes, expecting ${status}): ` +
      `${e.message}: ${e.cause ? `${e.cause.code ?? ''} ${e.cause.message}` : 'no cause'}`);
  }
  const text = await res.text();
  assert.equal(res.status, status, `${method} ${route} ${String(body).slice(0, 80)} -> ${res.status} ${text}`);
  const j = JSON.parse(text);
  assert.equal(typeof j.error.message, 'string');
  assert.equal(typeof j.error.type, 'string');
}

test('bad input gets the right 4xx and an error object', async () => {
  for (const bad of BAD) await sendBad(bad);
  // The client surfaces them as typed errors.
  await assert.rejects(client.completions.create({ model: MODEL_NAME, prompt: 'x', max_tokens: 0 }),
    (e) => e instanceof OpenAI.BadRequestError);
  await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }), (e) => e instanceof OpenAI.NotFoundError);
});

test('malformed requests interleaved with valid streams break nothing', async () => {
  const params = (i) => ({ model: MODEL_NAME, prompt: PROMPTS[i], max_tokens: 20, temperature: 0, ignore_eos: true });
  const valid = Array.from({ length: 8 }, (_, i) => streamText(params(i)));
  const junk = [];
  for (let i = 0; i < 300; ++i) {
    junk.push(sendBad(BAD[i % BAD.length]));
    if (i % 25 === 0) await sleep(5);
  }
  await Promise.all(junk);
  const results = await Promise.all(valid);
  for (const r of results) {
    assert.equal(r.finish, 'length');
    assert.equal(r.usage.completion_tokens, 20);
  }
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
});

test('a client that disconnects mid-stream frees its sequence', async () => {
  const m0 = await metrics(server.url);
  const stream = await client.completions.create({
    model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 2000, ignore_eos: true, stream: true,
  });
  let n = 0;
  for await (const chunk of stream) {
    void chunk;
    if (++n === 3) break;  // breaking out of the loop aborts the request
  }
  const t0 = Date.now();
  let m1;
  for (;;) {
    m1 = await metrics(server.url);
    const cancelled = (m1['tandem_finished_requests_total{reason="cancelled"}'] ?? 0) -
      (m0['tandem_finished_requests_total{reason="cancelled"}'] ?? 0);
    if (cancelled === 1 && m1.tandem_running_sequences === 0) break;
    assert.ok(Date.now() - t0 < 3000, 'the cancelled sequence was still running after 3 s');
    await sleep(20);
  }
  const generated = m1.tandem_generated_tokens_total - m0.tandem_generated_tokens_total;
  assert.ok(generated < 2000, `generation went on after the disconnect (${generated} tokens)`);
});
