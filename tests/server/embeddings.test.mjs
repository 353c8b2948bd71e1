// POST /v1/embeddings end to end through the official client: a bert server (encoder only) and a decoder
// server. Single and batched inputs, token-id inputs, base64 decoding equal to the floats, answers equal to
// `tandem embed` for the same texts, concurrent requests equal to the same requests alone, every bad input a
// 400 with an error object, and the generation routes refused by the encoder-only server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, metrics, BIN, SHARED, MODEL, MODEL_NAME } from './harness.mjs';

const BERT = path.join(SHARED, 'models', 'synth', 'synth-bert-d64-F16.gguf');
const BERT_NAME = 'synth-bert-d64-F16';
const DIM = 64;
const TEXTS = ['the quick brown fox', 'jumps over the lazy dog', 'hello', 'embeddings for retrieval, batched'];

let bert;
let client;

before(async () => {
  bert = await startServer(['--matryoshka-dims', '16,32'], BERT);
  client = new OpenAI({ baseURL: `${bert.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  const { code } = await bert.stop();
  assert.equal(code, 0, `the server should exit 0 after SIGTERM:\n${bert.log()}`);
});

// `tandem embed` on the same texts, one line each, as float32 values.
function cliEmbeddings(model, texts) {
  const r = spawnSync(BIN, ['embed', '-m', model, '-t', '1', '--jsonl'], {
    input: texts.map((t) => JSON.stringify(t)).join('\n') + '\n',
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.trim().split('\n').map((line) => JSON.parse(line).map(Math.fround));
}

const f32 = (values) => values.map(Math.fround);

async function post(body, url = bert.url) {
  const res = await fetch(`${url}/v1/embeddings`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

test('one string: one normalised embedding of the model width, with usage', async () => {
  const r = await client.embeddings.create({ model: BERT_NAME, input: TEXTS[0], encoding_format: 'float' });
  assert.equal(r.object, 'list');
  assert.equal(r.model, BERT_NAME);
  assert.equal(r.data.length, 1);
  assert.equal(r.data[0].object, 'embedding');
  assert.equal(r.data[0].index, 0);
  assert.equal(r.data[0].embedding.length, DIM);
  const norm = Math.sqrt(r.data[0].embedding.reduce((s, x) => s + x * x, 0));
  assert.ok(Math.abs(norm - 1) < 1e-5, `norm ${norm}`);
  assert.ok(r.usage.prompt_tokens >= 3, JSON.stringify(r.usage));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
});

test('a batch equals `tandem embed` and each input sent alone', async () => {
  const batch = await client.embeddings.create({ model: BERT_NAME, input: TEXTS, encoding_format: 'float' });
  assert.deepEqual(batch.data.map((d) => d.index), [0, 1, 2, 3]);
  const cli = cliEmbeddings(BERT, TEXTS);
  let tokens = 0;
  for (let i = 0; i < TEXTS.length; ++i) {
    assert.deepEqual(f32(batch.data[i].embedding), cli[i], `input ${i} differs from tandem embed`);
    const alone = await client.embeddings.create({ model: BERT_NAME, input: TEXTS[i], encoding_format: 'float' });
    assert.deepEqual(alone.data[0].embedding, batch.data[i].embedding, `input ${i} alone`);
    tokens += alone.usage.prompt_tokens;
  }
  assert.equal(batch.usage.prompt_tokens, tokens);
});

test('base64 decodes to the same float32 values, by hand and through the client', async () => {
  const floats = await post({ model: BERT_NAME, input: TEXTS, encoding_format: 'float' });
  const b64 = await post({ model: BERT_NAME, input: TEXTS, encoding_format: 'base64' });
  assert.equal(b64.status, 200);
  // The client asks for base64 by default and decodes it itself.
  const viaClient = await client.embeddings.create({ model: BERT_NAME, input: TEXTS });
  for (let i = 0; i < TEXTS.length; ++i) {
    const bytes = Buffer.from(b64.body.data[i].embedding, 'base64');
    assert.equal(bytes.length, DIM * 4);
    const decoded = Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, DIM));
    assert.deepEqual(decoded, f32(floats.body.data[i].embedding));
    assert.deepEqual(f32(viaClient.data[i].embedding), decoded);
  }
});

test('token ids: one list or a list of lists', async () => {
  const one = await client.embeddings.create({ model: BERT_NAME, input: [5, 6, 7, 8], encoding_format: 'float' });
  assert.equal(one.data.length, 1);
  assert.equal(one.usage.prompt_tokens, 4);
  const many = await client.embeddings.create({
    model: BERT_NAME, input: [[5, 6, 7, 8], [9, 10]], encoding_format: 'float',
  });
  assert.equal(many.data.length, 2);
  assert.equal(many.usage.prompt_tokens, 6);
  assert.deepEqual(many.data[0].embedding, one.data[0].embedding);
});

test('dimensions: an allowed width is a renormalised prefix; another is a 400', async () => {
  const full = await client.embeddings.create({ model: BERT_NAME, input: TEXTS[1], encoding_format: 'float' });
  const cut = await client.embeddings.create({
    model: BERT_NAME, input: TEXTS[1], encoding_format: 'float', dimensions: 16,
  });
  assert.equal(cut.data[0].embedding.length, 16);
  const prefix = full.data[0].embedding.slice(0, 16);
  const norm = Math.sqrt(prefix.reduce((s, x) => s + x * x, 0));
  cut.data[0].embedding.forEach((x, i) => assert.ok(Math.abs(x - prefix[i] / norm) < 1e-6, `value ${i}`));
  const bad = await post({ model: BERT_NAME, input: 'x', dimensions: 20 });
  assert.equal(bad.status, 400);
  assert.equal(bad.body.error.param, 'dimensions');
  assert.match(bad.body.error.message, /64, 16, 32/);
});

test('eight concurrent clients get what each gets alone', async () => {
  const requests = Array.from({ length: 8 }, (_, c) =>
    Array.from({ length: 6 }, (_, s) => `client ${c} sentence ${s} ${'word '.repeat((c + s) % 5)}`));
  const alone = [];
  for (const input of requests) alone.push(await post({ model: BERT_NAME, input, encoding_format: 'base64' }));
  const together = await Promise.all(requests.map((input) => post({ model: BERT_NAME, input, encoding_format: 'base64' })));
  together.forEach((r, c) => assert.deepEqual(r.body.data, alone[c].body.data, `client ${c}`));
});

test('bad inputs: each a 400 with an error object naming the field', async () => {
  const cases = [
    [{ model: BERT_NAME, input: [] }, 'input', /empty list/],
    [{ model: BERT_NAME, input: '' }, 'input', /empty string/],
    [{ model: BERT_NAME, input: ['ok', ''] }, 'input[1]', /empty string/],
    [{ model: BERT_NAME, input: ['ok', 3] }, 'input[1]', /must be a string/],
    [{ model: BERT_NAME, input: { text: 'x' } }, 'input', /must be a string/],
    [{ model: BERT_NAME, input: [[1, 2], 'x'] }, 'input[1]', /array of token ids/],
    [{ model: BERT_NAME, input: [1, 1e9] }, 'input[1]', /outside the vocabulary/],
    [{ model: BERT_NAME }, 'input', /required/],
    [{ model: BERT_NAME, input: 'x', encoding_format: 'int8' }, 'encoding_format', /base64/],
    [{ model: BERT_NAME, input: Array(2049).fill('x') }, 'input', /at most 2048/],
    [{ model: BERT_NAME, input: 'word '.repeat(600) }, 'input', /maximum context length is 512 tokens.*truncate/],
  ];
  for (const [body, param, message] of cases) {
    const r = await post(body);
    assert.equal(r.status, 400, JSON.stringify(body).slice(0, 80));
    assert.equal(r.body.error.type, 'invalid_request_error');
    assert.equal(r.body.error.param, param, JSON.stringify(r.body));
    assert.match(r.body.error.message, message);
  }
  const malformed = await post('{"model": ');
  assert.equal(malformed.status, 400);
  assert.equal(typeof malformed.body.error.message, 'string');
  // The client surfaces them as BadRequestError.
  await assert.rejects(client.embeddings.create({ model: BERT_NAME, input: [] }), (e) => e.status === 400);
  const unknown = await post({ model: 'nope', input: 'x' });
  assert.equal(unknown.status, 404);
});

test('truncate: true embeds the first tokens of an over-long input', async () => {
  const r = await post({ model: BERT_NAME, input: 'word '.repeat(600), truncate: true, encoding_format: 'float' });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.usage.prompt_tokens, 512);
  assert.equal(r.body.data[0].embedding.length, DIM);
});

test('an encoder-only server answers the generation routes with 400', async () => {
  for (const call of [
    () => client.completions.create({ model: BERT_NAME, prompt: 'hi', max_tokens: 2 }),
    () => client.chat.completions.create({ model: BERT_NAME, messages: [{ role: 'user', content: 'hi' }] }),
  ]) {
    await assert.rejects(call, (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.code, 'embeddings_only');
      assert.match(e.message, /encoder \(bert\).*\/v1\/embeddings/);
      return true;
    });
  }
  const health = await fetch(`${bert.url}/health`);
  assert.equal(health.status, 200);
});

test('/metrics counts embedding requests, inputs and tokens', async () => {
  const before_ = await metrics(bert.url);
  const r = await client.embeddings.create({ model: BERT_NAME, input: TEXTS.slice(0, 2), encoding_format: 'float' });
  const after_ = await metrics(bert.url);
  assert.equal(after_.tandem_embedding_requests_total - before_.tandem_embedding_requests_total, 1);
  assert.equal(after_.tandem_embedding_inputs_total - before_.tandem_embedding_inputs_total, 2);
  assert.equal(after_.tandem_embedding_tokens_total - before_.tandem_embedding_tokens_total, r.usage.prompt_tokens);
  assert.ok(after_['tandem_requests_total{endpoint="/v1/embeddings",status="200"}'] >= 1);
  assert.ok(after_['tandem_requests_total{endpoint="/v1/embeddings",status="400"}'] >= 1);
});

test('a decoder server embeds with its pooling while it generates', async () => {
  const dec = await startServer(['-t', '1']);
  try {
    const c = new OpenAI({ baseURL: `${dec.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
    const texts = ['Once upon a time', 'there was a little girl'];
    const [gen, emb] = await Promise.all([
      c.completions.create({ model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 40, ignore_eos: true }),
      c.embeddings.create({ model: MODEL_NAME, input: texts, encoding_format: 'float' }),
    ]);
    assert.equal(gen.usage.completion_tokens, 40);
    const cli = cliEmbeddings(MODEL, texts);
    emb.data.forEach((d, i) => assert.deepEqual(f32(d.embedding), cli[i], `input ${i}`));
  } finally {
    const { code } = await dec.stop();
    assert.equal(code, 0, dec.log());
  }
});
