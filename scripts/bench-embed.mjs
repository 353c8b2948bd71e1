#!/usr/bin/env node
// Load generator for POST /v1/embeddings: --clients concurrent clients, each sending --per lines of --file as
// one request (base64, as the openai client asks by default), --rounds times. Reports input tokens per second
// of wall time (usage.prompt_tokens over the whole run) and, with --pid, the server's CPU seconds and tokens
// per CPU second (from /proc, Linux). Needs only Node.js 18+ (built-in fetch). Loopback URLs only.
//
//   node scripts/bench-embed.mjs --url http://127.0.0.1:8080 --file sentences.txt --clients 8 --per 32
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

const { values: opt } = parseArgs({
  options: {
    url: { type: 'string', default: 'http://127.0.0.1:8080' },
    model: { type: 'string' },
    file: { type: 'string' },
    clients: { type: 'string', default: '8' },
    per: { type: 'string', default: '32' },
    rounds: { type: 'string', default: '1' },
    pid: { type: 'string' },
    help: { type: 'boolean', short: 'h', default: false },
  },
});
if (opt.help || !opt.file) {
  console.log(`usage: node scripts/bench-embed.mjs --file LINES [--url URL] [--model NAME] [--clients N] [--per N]
       [--rounds N] [--pid SERVER_PID]`);
  process.exit(opt.help ? 0 : 2);
}
const url = new URL(opt.url);
if (!['127.0.0.1', 'localhost', '[::1]'].includes(url.hostname)) {
  console.error('bench-embed: only loopback URLs are accepted');
  process.exit(2);
}
const lines = readFileSync(opt.file, 'utf8').split('\n').filter((l) => l.length > 0);
const clients = Number(opt.clients), per = Number(opt.per), rounds = Number(opt.rounds);
if (lines.length < clients * per) {
  console.error(`bench-embed: ${opt.file} has ${lines.length} lines; --clients x --per needs ${clients * per}`);
  process.exit(2);
}
const model = opt.model ?? (await (await fetch(`${opt.url}/v1/models`)).json()).data[0].id;

// utime + stime of the server, in seconds (clock ticks of 1/100 s on Linux).
const cpu = () => {
  if (!opt.pid) return 0;
  const fields = readFileSync(`/proc/${opt.pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
};

async function client(c) {
  let tokens = 0;
  for (let r = 0; r < rounds; ++r) {
    const res = await fetch(`${opt.url}/v1/embeddings`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model, input: lines.slice(c * per, (c + 1) * per), encoding_format: 'base64' }),
    });
    const body = await res.json();
    if (res.status !== 200) throw new Error(`client ${c}: ${res.status} ${JSON.stringify(body)}`);
    tokens += body.usage.prompt_tokens;
  }
  return tokens;
}

const cpu0 = cpu();
const t0 = performance.now();
const tokens = (await Promise.all(Array.from({ length: clients }, (_, c) => client(c)))).reduce((a, b) => a + b);
const wall = (performance.now() - t0) / 1000;
const cpuSeconds = cpu() - cpu0;
console.log(`${clients} clients x ${per} inputs x ${rounds} rounds: ${tokens} tokens in ${wall.toFixed(2)} s wall = ` +
  `${(tokens / wall).toFixed(0)} tokens/s` +
  (opt.pid ? `; server CPU ${cpuSeconds.toFixed(2)} s = ${(tokens / cpuSeconds).toFixed(0)} tokens per CPU second` : ''));
