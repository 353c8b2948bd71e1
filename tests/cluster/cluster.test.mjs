// Three `tandem serve` replicas behind HAProxy (scripts/serve-cluster.sh): a conversation's turns stay on one
// replica and reuse its prefix cache; killing a replica under load loses no request that had not started
// streaming; a draining replica gets no new requests while its running one finishes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { startCluster, runChats, chatTurn } from '../../scripts/bench-cluster.mjs';

const BIN = process.env.TANDEM_BIN;
const SHARED = process.env.TANDEM_SHARED;
if (!BIN || !SHARED) throw new Error('TANDEM_BIN and TANDEM_SHARED must be set (use tests/cluster/run.sh)');
const MODEL = path.join(SHARED, 'models', 'stories260K.gguf');
const MODEL_NAME = 'stories260K';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function withCluster(options, fn) {
  const cluster = await startCluster({ bin: BIN, model: MODEL, replicas: 3, port: await freePort(), ...options });
  try {
    return await fn(cluster);
  } finally {
    const { code } = await cluster.stop();
    assert.ok(code === 0 || code === 143, `serve-cluster.sh exited ${code}:\n${cluster.output()}`);
  }
}

async function replicaMetric(replica, name) {
  const res = await fetch(`${replica.url}/metrics`);
  const line = (await res.text()).split('\n').find((l) => l.startsWith(`${name} `));
  return line ? Number(line.split(' ')[1]) : NaN;
}

async function waitFor(what, ms, fn) {
  const t0 = Date.now();
  while (!(await fn())) {
    assert.ok(Date.now() - t0 < ms, `${what} within ${ms} ms`);
    await sleep(20);
  }
}

// Generation requests a replica logged (answered or refused).
const generations = (replica) =>
  readFileSync(replica.log, 'utf8').split('\n').filter((l) => /^serve: POST \/v1\/(chat\/)?completions /.test(l));

// The replica each key routes to, from one small request per key sent alone (no load to bound).
async function routes(url, keys) {
  const out = {};
  for (const key of keys) {
    const r = await chatTurn(url, MODEL_NAME, [{ role: 'user', content: 'Hi' }], { session: key, maxTokens: 1 });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    out[key] = r.replica;
  }
  return out;
}

function completion(url, body, session) {
  return fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-session-id': session },
    body: JSON.stringify({ model: MODEL_NAME, prompt: 'Once upon a time', ...body }),
  });
}

test('each conversation stays on one replica and reuses its prefix, keyed by header or by user', async () => {
  // Pure consistent hashing: the load bound would move a turn whenever its replica has more requests in
  // flight than 1.5 times the average, which six clients do now and then.
  await withCluster({ balanceFactor: 0, serveArgs: ['-t', '1', '--parallel', '8'] }, async (cluster) => {
    const byHeader = await routes(cluster.url, ['conv-0', 'conv-1', 'conv-2', 'conv-3', 'conv-4', 'conv-5']);
    // The same key sent as the OpenAI user field routes the same way.
    for (const key of ['conv-3', 'conv-4', 'conv-5']) {
      const r = await chatTurn(cluster.url, MODEL_NAME, [{ role: 'user', content: 'Hi' }], { user: key, maxTokens: 1 });
      assert.equal(r.replica, byHeader[key], `user '${key}'`);
    }
    assert.ok(new Set(Object.values(byHeader)).size >= 2, `six keys all went to one replica: ${JSON.stringify(byHeader)}`);

    const chats = await runChats(cluster.url, MODEL_NAME, {
      clients: 6, turns: 4, maxTokens: 32,
      keyOf: (c) => (c < 3 ? { session: `conv-${c}` } : { user: `conv-${c}` }),
    });
    chats.forEach((turns, c) => {
      const where = turns.map((t) => t.replica);
      assert.ok(turns.every((t) => t.status === 200), `chat ${c}: ${JSON.stringify(turns)}`);
      assert.deepEqual(where, turns.map(() => byHeader[`conv-${c}`]), `chat ${c} turns ran on ${where}`);
      for (let t = 1; t < turns.length; ++t) {
        // The previous turn's prompt (and most of its answer) is the start of this one's.
        assert.ok(turns[t].cached_tokens >= turns[t - 1].prompt_tokens,
          `chat ${c} turn ${t}: ${turns[t].cached_tokens} cached, previous prompt ${turns[t - 1].prompt_tokens}`);
      }
    });
  });
});

test('killing a replica under load loses no request that had not started streaming', async () => {
  await withCluster({ serveArgs: ['-t', '1', '--parallel', '4', '-c', '4096'] }, async (cluster) => {
    const keys = Array.from({ length: 12 }, (_, i) => `load-${i}`);
    const route = await routes(cluster.url, keys);
    const victim = cluster.replicas[1];
    const onVictim = keys.filter((k) => route[k] === victim.name);
    assert.ok(onVictim.length >= 1, `no key of ${JSON.stringify(route)} routes to ${victim.name}`);

    // A long whole request that will be running on the victim when it dies.
    const long = completion(cluster.url, { max_tokens: 3500, ignore_eos: true, temperature: 0 }, onVictim[0])
      .then(async (res) => ({ status: res.status, replica: res.headers.get('x-tandem-replica'), body: await res.json() }));
    await waitFor('the long request runs on the victim', 10000,
      async () => (await replicaMetric(victim, 'tandem_running_sequences')) >= 1);

    // Eight clients, each alternating whole and streamed requests, across all keys.
    const outcomes = [];
    const client = async (c) => {
      for (let i = 0; i < 4; ++i) {
        const stream = i % 2 === 1;
        const outcome = { stream, key: keys[(c + 3 * i) % keys.length] };
        outcomes.push(outcome);
        try {
          const res = await completion(cluster.url, { max_tokens: 48, ignore_eos: true, stream, seed: c }, outcome.key);
          outcome.status = res.status;
          outcome.replica = res.headers.get('x-tandem-replica');
          const text = await res.text();
          outcome.done = stream ? text.trimEnd().endsWith('data: [DONE]') : JSON.parse(text).choices?.length === 1;
        } catch (e) {
          outcome.error = String(e.cause ?? e);
        }
      }
    };
    const load = Promise.all(Array.from({ length: 8 }, (_, c) => client(c)));
    await sleep(150);
    process.kill(victim.pid, 'SIGKILL');
    await load;

    const r = await long;
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.notEqual(r.replica, victim.name);
    assert.equal(r.body.usage.completion_tokens, 3500, 'the retried request ran in full elsewhere');
    for (const o of outcomes) {
      // Only a stream whose 200 and first bytes had come from the victim may be cut.
      if (o.stream && o.replica === victim.name) continue;
      assert.ok(o.status === 200 && o.done, `lost: ${JSON.stringify(o)}`);
    }
    // The victim's keys now go elsewhere.
    const after = await routes(cluster.url, onVictim);
    assert.ok(Object.values(after).every((name) => name !== victim.name), JSON.stringify(after));
  });
});

test('a draining replica gets no new requests and finishes its running one', async () => {
  // Without the load bound, which would steer new requests away from the busy replica by itself.
  const context = 16384;
  await withCluster({ balanceFactor: 0, serveArgs: ['-t', '1', '-c', `${context}`, '--drain-timeout', '120'] }, async (cluster) => {
    const keys = Array.from({ length: 12 }, (_, i) => `drain-${i}`);
    const route = await routes(cluster.url, keys);
    const draining = cluster.replicas[0];
    const mine = keys.filter((k) => route[k] === draining.name);
    assert.ok(mine.length >= 1, `no key of ${JSON.stringify(route)} routes to ${draining.name}`);

    // The running request must outlast the sends below (about three seconds) on any machine: double a
    // probe's length on this replica until it takes two seconds, then run twice that many tokens (later
    // tokens attend to more positions, so that takes at least four).
    let probeTokens = 256;
    for (;;) {
      const t0 = performance.now();
      const probe = await completion(draining.url, { max_tokens: probeTokens, ignore_eos: true }, mine[0]);
      const probeText = await probe.text();
      assert.equal(probe.status, 200, probeText);
      if (performance.now() - t0 >= 2000 || 4 * probeTokens > context - 64) break;
      probeTokens *= 2;
    }
    const maxTokens = Math.min(context - 64, 2 * probeTokens);
    const running = completion(cluster.url, { max_tokens: maxTokens, ignore_eos: true }, mine[0])
      .then(async (res) => ({ status: res.status, replica: res.headers.get('x-tandem-replica'), body: await res.json() }));
    await waitFor('the long request runs', 10000,
      async () => (await replicaMetric(draining, 'tandem_running_sequences')) >= 1);
    process.kill(draining.pid, 'SIGTERM');
    await waitFor('/health reports draining', 2000, async () => {
      const res = await fetch(`${draining.url}/health`);
      return res.status === 503 && (await res.json()).status === 'draining';
    });

    // Before the balancer's health check notices, the replica refuses (503) and the balancer retries
    // elsewhere; once it has noticed (two checks 500 ms apart), nothing reaches the replica at all.
    const send = async (n) => {
      for (let i = 0; i < n; ++i) {
        const res = await completion(cluster.url, { max_tokens: 4 }, mine[i % mine.length]);
        const text = await res.text();
        assert.equal(res.status, 200, text);
        assert.notEqual(res.headers.get('x-tandem-replica'), draining.name);
      }
    };
    // A request that reaches the draining replica is refused with a 503 and logged; the running request's
    // own line (logged when it ends, which may be during the sends) is not one of them.
    const refused = () => generations(draining).filter((l) => / 503 /.test(l)).length;
    await send(5);
    await sleep(1500);
    const seen = refused();
    await send(10);
    assert.equal(refused(), seen, 'requests reached the draining replica after its health check');
    assert.ok(seen > 1, 'the replica refused requests before the balancer noticed its drain');
    assert.doesNotThrow(() => process.kill(draining.pid, 0), 'the replica was still draining');

    const r = await running;
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.replica, draining.name);
    assert.equal(r.body.choices[0].finish_reason, 'length');
  });
});
