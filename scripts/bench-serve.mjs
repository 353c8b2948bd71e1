#!/usr/bin/env node
// Load generator for `tandem serve`: N concurrent streamed completions against a running server, reporting
// aggregate tokens/s, per-stream decode tokens/s and time to first token (p50 / p99). Optionally interleaves
// malformed requests (--junk) and counts failures. Needs only Node.js 18+ (built-in fetch), no packages.
//
//   node scripts/bench-serve.mjs --url http://127.0.0.1:8080 --streams 8 --prompt-tokens 32 --max-tokens 64
//
// Prompts are token-id arrays, distinct per stream (no prefix reuse), and generation ignores end-of-text
// tokens, so every stream produces exactly --max-tokens tokens. Only loopback URLs are accepted.
import { parseArgs } from 'node:util';

let opt;
try {
  ({ values: opt } = parseArgs({
    options: {
      url: { type: 'string', default: 'http://127.0.0.1:8080' },
      model: { type: 'string' },
      streams: { type: 'string', default: '8' },
      rounds: { type: 'string', default: '1' },
      'prompt-tokens': { type: 'string', default: '32' },
      'max-tokens': { type: 'string', default: '64' },
      'api-key': { type: 'string' },
      junk: { type: 'string', default: '0' },
      seed: { type: 'string', default: '0' },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  }));
} catch (e) {
  console.error(`bench-serve: ${e.message.split('\n')[0]} (see --help)`);
  process.exit(2);
}
if (opt.help) {
  console.log(`usage: node scripts/bench-serve.mjs [--url URL] [--model NAME] [--streams N] [--rounds N]
       [--prompt-tokens N] [--max-tokens N] [--api-key KEY] [--junk N] [--seed N] [--json]
N concurrent streamed completions against a running tandem serve (loopback only); reports aggregate and
per-stream tokens/s and time to first token p50/p99. --junk N interleaves N malformed requests. The prompts
depend on the stream, the round and --seed (default 0): a server keeps the prompts of earlier runs in its
prefix cache, so give each run against the same server its own seed to measure fresh prompts.`);
  process.exit(0);
}
const url = new URL(opt.url);
if (!['127.0.0.1', 'localhost', '[::1]'].includes(url.hostname)) {
  console.error('bench-serve: only loopback servers (127.0.0.1, localhost, [::1]) may be targeted');
  process.exit(2);
}
const streams = Number(opt.streams), rounds = Number(opt.rounds), junkCount = Number(opt.junk);
const promptTokens = Number(opt['prompt-tokens']), maxTokens = Number(opt['max-tokens']);
const seed = Number(opt.seed);
for (const [name, v, min] of [['streams', streams, 1], ['rounds', rounds, 1], ['junk', junkCount, 0],
  ['prompt-tokens', promptTokens, 1], ['max-tokens', maxTokens, 1], ['seed', seed, 0]]) {
  if (!Number.isInteger(v) || v < min) {
    console.error(`bench-serve: --${name} must be an integer of at least ${min}`);
    process.exit(2);
  }
}
const headers = { 'content-type': 'application/json' };
if (opt['api-key']) headers.authorization = `Bearer ${opt['api-key']}`;
const base = opt.url.replace(/\/$/, '');

async function modelName() {
  if (opt.model) return opt.model;
  const res = await fetch(`${base}/v1/models`, { headers });
  if (res.status !== 200) throw new Error(`/v1/models answered ${res.status}`);
  return (await res.json()).data[0].id;
}

function prompt(stream, round) {
  let x = ((stream + 1) * 7919 + round * 104729 + seed * 1299709) % 2147483648;
  return Array.from({ length: promptTokens }, () => {
    x = (x * 1103515245 + 12345) % 2147483648;
    return 100 + (x % 300);
  });
}

// One streamed completion: times of the first and last token, token count, and whether it succeeded.
async function runStream(model, stream, round) {
  const t0 = performance.now();
  const body = JSON.stringify({
    model, prompt: prompt(stream, round), max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  });
  const res = await fetch(`${base}/v1/completions`, { method: 'POST', headers, body });
  if (res.status !== 200) return { ok: false, status: res.status, text: await res.text() };
  let first = null, last = null, tokens = 0, buf = '', done = false;
  const decoder = new TextDecoder();
  for await (const part of res.body) {
    buf += decoder.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ')) continue;
      const data = ev.slice(6);
      if (data === '[DONE]') {
        done = true;
        continue;
      }
      const j = JSON.parse(data);
      if (j.error) return { ok: false, status: 200, text: data };
      if (j.usage) tokens = j.usage.completion_tokens;
      if (j.choices?.length && (j.choices[0].text || j.choices[0].finish_reason === null)) {
        const now = performance.now();
        if (first === null) first = now;
        last = now;
      }
    }
  }
  const ok = done && tokens === maxTokens;
  return { ok, status: 200, ttft: (first - t0) / 1000, decode: (last - first) / 1000, tokens, end: performance.now() };
}

const JUNK = [
  '{not json', '[1,2]', '', '{"model":"x","prompt":"y"}', '{"prompt":5}', '{"model":null}',
  '{"model":"M","prompt":"hi","max_tokens":0}', '{"model":"M","prompt":"hi","max_tokens":"9"}',
  '{"model":"M","prompt":"hi","temperature":-1}', '{"model":"M","messages":[]}',
];

async function junk(model) {
  let unexpected = 0;
  for (let i = 0; i < junkCount; ++i) {
    const body = JUNK[i % JUNK.length].replace('"M"', JSON.stringify(model));
    const route = i % 3 === 0 ? '/v1/chat/completions' : '/v1/completions';
    const res = await fetch(`${base}${route}`, { method: 'POST', headers, body });
    const text = await res.text();
    if (res.status < 400 || res.status >= 500 || !JSON.parse(text).error) ++unexpected;
  }
  return unexpected;
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
};

const model = await modelName();
const results = [];
let wall = 0, junkUnexpected = 0;
for (let r = 0; r < rounds; ++r) {
  const t0 = performance.now();
  const junkRun = junkCount > 0 ? junk(model) : Promise.resolve(0);
  const out = await Promise.all(Array.from({ length: streams }, (_, s) => runStream(model, s, r)));
  wall += (Math.max(...out.map((o) => o.end ?? performance.now())) - t0) / 1000;
  junkUnexpected += await junkRun;
  results.push(...out);
}
const ok = results.filter((o) => o.ok);
const failed = results.length - ok.length;
const total = ok.reduce((s, o) => s + o.tokens, 0);
const report = {
  streams, rounds, prompt_tokens: promptTokens, max_tokens: maxTokens,
  aggregate_tok_s: total / wall,
  per_stream_tok_s: ok.length ? ok.reduce((s, o) => s + (o.tokens - 1) / o.decode, 0) / ok.length : 0,
  ttft_p50_s: ok.length ? pct(ok.map((o) => o.ttft), 50) : null,
  ttft_p99_s: ok.length ? pct(ok.map((o) => o.ttft), 99) : null,
  failed_streams: failed, junk_requests: junkCount * rounds, junk_unexpected: junkUnexpected,
};
if (opt.json) {
  console.log(JSON.stringify(report));
} else {
  console.log(`${streams} streams x ${rounds} rounds, ${promptTokens}-token prompts, ${maxTokens} tokens each`);
  console.log(`aggregate ${report.aggregate_tok_s.toFixed(2)} tok/s, per stream ${report.per_stream_tok_s.toFixed(2)} tok/s`);
  console.log(`time to first token p50 ${report.ttft_p50_s?.toFixed(3)} s, p99 ${report.ttft_p99_s?.toFixed(3)} s`);
  if (junkCount) console.log(`malformed requests ${report.junk_requests}, answered other than 4xx + error object: ${junkUnexpected}`);
  if (failed) console.log(`FAILED streams: ${failed}: ${JSON.stringify(results.find((o) => !o.ok))}`);
}
process.exit(failed || junkUnexpected ? 1 : 0);
