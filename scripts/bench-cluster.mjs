#!/usr/bin/env node
// Prefix-cache reuse across replicas: the same multi-turn chat workload through HAProxy over N `tandem serve`
// replicas (scripts/serve-cluster.sh) with session affinity (bounded load, as configured by default), with
// affinity and no load bound, and with round-robin, printing the share of prompt tokens each served from the
// replicas' prefix caches side by side.
//
//   node scripts/bench-cluster.mjs -m MODEL [--replicas 3] [--clients 8] [--turns 6] [--max-tokens 64]
//        [--port 18080] [--bin build/tandem] [--json] [-- serve flags...]
//
// Each client holds one conversation: a system message shared by all, then a user message per turn, each
// turn sent with the whole history so far and the client's X-Session-Id. Clients run at once, turns in order.
// Loopback only; Node.js 18 or later, no packages. Also the library of tests/cluster.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

// Starts scripts/serve-cluster.sh and resolves once it prints "cluster: ready" (rejects after 120 s or if it
// exits first). Returns { url, replicas: [{ name, pid, url, log }], stop() }.
export function startCluster({ bin, model, replicas = 3, port, balance = 'affinity', balanceFactor, serveArgs = [] }) {
  const args = [path.join(here, 'serve-cluster.sh'), String(replicas), '-m', model, '--port', String(port),
    '--balance', balance, '--bin', bin, ...(balanceFactor !== undefined ? ['--balance-factor', String(balanceFactor)] : []),
    ...serveArgs];
  const proc = spawn('bash', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  proc.stderr.on('data', (d) => { err += d.toString(); });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const ready = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the cluster did not start in 120 s:\n${out}${err}`)), 120000);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      if (/^cluster: ready$/m.test(out)) {
        clearTimeout(timer);
        resolve();
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`serve-cluster.sh exited (code ${code}, signal ${signal}) before ready:\n${out}${err}`));
    });
  });
  return ready.then(() => {
    const replicas = [...out.matchAll(/^cluster: replica (\S+) pid (\d+) (\S+) log (.+)$/gm)]
      .map((m) => ({ name: m[1], pid: Number(m[2]), url: m[3], log: m[4] }));
    return {
      url: `http://127.0.0.1:${port}`,
      replicas,
      exited,
      output: () => out + err,
      async stop() {
        if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
        const killer = setTimeout(() => proc.kill('SIGKILL'), 60000);
        const r = await exited;
        clearTimeout(killer);
        return r;
      },
    };
  });
}

const SYSTEM = 'You are a friendly storyteller. You tell short, simple stories for small children about ' +
  'animals, toys and the sea, and you always answer in a kind and happy voice.';
const TOPICS = ['a cat', 'a red ball', 'a big boat', 'a little bird', 'a brave dog', 'a green frog', 'a toy car',
  'a happy fish', 'a tall tree', 'a blue kite'];

// One chat request. Returns { status, replica, body } (body: the parsed JSON, or the error text).
export async function chatTurn(url, model, messages, { session, user, maxTokens = 64, seed = 1 } = {}) {
  const headers = { 'content-type': 'application/json' };
  if (session) headers['x-session-id'] = session;
  const body = { model, messages, max_tokens: maxTokens, temperature: 0, seed };
  if (user) body.user = user;
  const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify(body) });
  const text = await res.text();
  let parsed = text;
  try { parsed = JSON.parse(text); } catch { /* keep the text */ }
  return { status: res.status, replica: res.headers.get('x-tandem-replica'), body: parsed };
}

// Runs `clients` conversations of `turns` turns at once. keyOf(c) gives client c's routing key as
// { session } (header) or { user } (body field). Returns per client the list of turns
// { status, replica, prompt_tokens, cached_tokens }.
export async function runChats(url, model, { clients = 8, turns = 6, maxTokens = 64, keyOf, tag = '' } = {}) {
  const key = keyOf ?? ((c) => ({ session: `chat-${tag}${c}` }));
  const one = async (c) => {
    const messages = [{ role: 'system', content: SYSTEM }];
    const log = [];
    for (let t = 0; t < turns; ++t) {
      messages.push({ role: 'user', content: `Now ${TOPICS[(c + t) % TOPICS.length]} and ` +
        `${TOPICS[(3 * c + 2 * t + 1) % TOPICS.length]}, please.` });
      const r = await chatTurn(url, model, messages, { ...key(c), maxTokens, seed: c * 100 + t });
      const usage = r.body?.usage;
      log.push({ status: r.status, replica: r.replica, prompt_tokens: usage?.prompt_tokens ?? 0,
        cached_tokens: usage?.prompt_tokens_details?.cached_tokens ?? 0, error: r.status === 200 ? null : r.body });
      if (r.status !== 200) break;
      messages.push({ role: 'assistant', content: r.body.choices[0].message.content });
    }
    return log;
  };
  return Promise.all(Array.from({ length: clients }, (_, c) => one(c)));
}

export function summarize(chats) {
  let prompt = 0;
  let cached = 0;
  let requests = 0;
  let failed = 0;
  let sticky = 0;
  for (const turns of chats) {
    for (const t of turns) {
      ++requests;
      if (t.status !== 200) ++failed;
      prompt += t.prompt_tokens;
      cached += t.cached_tokens;
    }
    if (new Set(turns.map((t) => t.replica)).size === 1) ++sticky;
  }
  return { requests, failed, prompt_tokens: prompt, cached_tokens: cached, cached_share: prompt ? cached / prompt : 0,
    chats_on_one_replica: sticky, chats: chats.length };
}

function parseArgs(argv) {
  const o = { replicas: 3, clients: 8, turns: 6, maxTokens: 64, port: 18080, bin: path.join(here, '..', 'build', 'tandem'),
    json: false, serveArgs: ['-t', '1', '--parallel', '8'] };
  const rest = argv.indexOf('--');
  if (rest >= 0) {
    o.serveArgs = argv.slice(rest + 1);
    argv = argv.slice(0, rest);
  }
  const int = (name, v, lo, hi) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < lo || n > hi) throw new Error(`${name} must be an integer from ${lo} to ${hi}`);
    return n;
  };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const v = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '-m' || a === '--model') o.model = v();
    else if (a === '--replicas') o.replicas = int(a, v(), 1, 16);
    else if (a === '--clients') o.clients = int(a, v(), 1, 64);
    else if (a === '--turns') o.turns = int(a, v(), 1, 32);
    else if (a === '--max-tokens') o.maxTokens = int(a, v(), 1, 4096);
    else if (a === '--port') o.port = int(a, v(), 1, 65535);
    else if (a === '--bin') o.bin = v();
    else if (a === '--json') o.json = true;
    else throw new Error(`unknown argument '${a}' (serve flags go after --)`);
  }
  if (!o.model) throw new Error('-m MODEL is required');
  return o;
}

async function main() {
  let o;
  try {
    o = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error(`bench-cluster: ${e.message}`);
    process.exit(2);
  }
  const model = path.basename(o.model).replace(/\.gguf$/, '');
  const modes = [
    { label: 'affinity', balance: 'affinity' },
    { label: 'no load bound', balance: 'affinity', balanceFactor: 0 },
    { label: 'round-robin', balance: 'roundrobin' },
  ];
  const results = {};
  for (const mode of modes) {
    const cluster = await startCluster({ bin: o.bin, model: o.model, replicas: o.replicas, port: o.port,
      balance: mode.balance, balanceFactor: mode.balanceFactor, serveArgs: o.serveArgs });
    try {
      const t0 = performance.now();
      const chats = await runChats(cluster.url, model, { clients: o.clients, turns: o.turns, maxTokens: o.maxTokens });
      results[mode.label] = { ...summarize(chats), seconds: (performance.now() - t0) / 1000 };
    } finally {
      await cluster.stop();
    }
  }
  if (o.json) {
    console.log(JSON.stringify(results, null, 2));
    return;
  }
  const pct = (x) => `${(100 * x).toFixed(1)}%`;
  const row = (name, f) => `${name.padEnd(22)}${modes.map((m) => String(f(results[m.label])).padStart(16)).join('')}`;
  console.log(`${o.clients} clients x ${o.turns} turns over ${o.replicas} replicas (serve ${o.serveArgs.join(' ')})`);
  console.log(row('', (r) => modes.find((m) => results[m.label] === r).label));
  console.log(row('prompt tokens', (r) => r.prompt_tokens));
  console.log(row('from prefix caches', (r) => r.cached_tokens));
  console.log(row('share cached', (r) => pct(r.cached_share)));
  console.log(row('chats on one replica', (r) => `${r.chats_on_one_replica}/${r.chats}`));
  console.log(row('failed requests', (r) => r.failed));
  console.log(row('seconds', (r) => r.seconds.toFixed(2)));
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((e) => {
    console.error(`bench-cluster: ${e.stack ?? e}`);
    process.exit(1);
  });
}
