// Speculation in the server: greedy requests give the same text with speculation on as off, request by
// request, under 8 concurrent streams with prompts of mixed lengths, with n-gram lookup and with a draft
// model (batched across the running sequences), drafting chains or token trees (--tree-nodes, also from an
// EAGLE-3 drafter that reads the target's hidden states, trained here briefly); /metrics
// counts the drafts, the tree nodes verified and the gates' decisions per drafter kind. (The real tiny draft model costs about as much as its target, so its gate mostly stays off;
// tests/test_scheduler_spec.cpp covers its drafting with free drafts.)
import { execFileSync } from 'node:child_process';
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, metrics, BIN, MODEL, SHARED, MODEL_NAME } from './harness.mjs';

const DRAFT = path.join(SHARED, 'models', 'llama2xs-tok512.gguf');
const COMMON = ['--parallel', '8', '--queue', '16'];
const servers = {};

before(async () => {
  // The speculating servers measure their verify costs at start; keep that out of the user's cache.
  process.env.XDG_CACHE_HOME = fs.mkdtempSync(path.join(os.tmpdir(), 'tandem-spec-cache-'));
  // Its proposals, not its quality, matter: a few seconds of training.
  const drafter = path.join(process.env.XDG_CACHE_HOME, 'eagle.gguf');
  execFileSync(BIN, ['train-drafter', '-m', MODEL, '-t', '2', '-o', drafter, '--tokens', '256', '--steps', '12'],
    { stdio: 'ignore' });
  servers.plain = await startServer(COMMON);
  servers.ngram = await startServer([...COMMON, '--draft', 'ngram']);
  servers.model = await startServer([...COMMON, '--draft-model', DRAFT]);
  servers.ngramTree = await startServer([...COMMON, '--draft', 'ngram', '--tree-nodes', '8']);
  servers.modelTree = await startServer([...COMMON, '--draft-model', DRAFT, '--tree-nodes', '8']);
  servers.eagleTree = await startServer([...COMMON, '--drafter', drafter, '--tree-nodes', '8']);
});

after(async () => {
  for (const s of Object.values(servers)) await s.stop();
});

// Prompts of 1 to 8 repetitions of a sentence and a varying tail: lengths from a few tokens to about 100, and
// text that repeats itself, so n-gram lookup finds continuations.
const PROMPTS = Array.from({ length: 8 }, (_, i) =>
  `${'Once upon a time, there was a little girl named Lily. '.repeat(i + 1)}She saw a ${['cat', 'dog', 'bird', 'tree'][i % 4]}`);

async function completeAll(server) {
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  return Promise.all(
    PROMPTS.map(async (prompt, i) => {
      const r = await client.completions.create({
        model: MODEL_NAME,
        prompt,
        max_tokens: 24 + 4 * i,
        temperature: 0,
        ignore_eos: true,
      });
      assert.equal(r.usage.completion_tokens, 24 + 4 * i);
      return r.choices[0].text;
    }),
  );
}

test('greedy text with speculation equals plain text request by request under 8 streams', async () => {
  const plain = await completeAll(servers.plain);
  for (const kind of ['ngram', 'model']) {
    const m0 = await metrics(servers[kind].url);
    const spec = await completeAll(servers[kind]);
    const m1 = await metrics(servers[kind].url);
    for (let i = 0; i < PROMPTS.length; ++i) assert.equal(spec[i], plain[i], `request ${i} with ${kind} drafting`);

    const delta = (k) => (m1[k] ?? 0) - (m0[k] ?? 0);
    const decisions = ['drafting', 'probing', 'off'].map((d) =>
      delta(`tandem_gate_decisions_total{drafter="${kind}",decision="${d}"}`));
    // One decision per sequence and iteration that gives it a token after its first (the prompt gives that).
    const total = decisions.reduce((a, b) => a + b, 0);
    assert.ok(total > 0, `${kind}: no gate decisions counted`);
    assert.ok(total <= delta('tandem_generated_tokens_total') - PROMPTS.length, `${kind}: ${total} decisions`);
    assert.equal(delta(`tandem_drafter_tokens_total{drafter="${kind}"}`), delta('tandem_draft_tokens_total'));
    assert.equal(delta(`tandem_drafter_accepted_total{drafter="${kind}"}`), delta('tandem_draft_accepted_total'));
    assert.ok(delta('tandem_verify_tokens_total') >= delta('tandem_verify_windows_total') + delta('tandem_draft_accepted_total'));
    assert.equal(m1.tandem_tree_nodes_verified_total, 0);
  }
});

test('greedy text with --tree-nodes 8 equals plain text request by request, and tree nodes are counted', async () => {
  const plain = await completeAll(servers.plain);
  for (const [name, kind] of [['ngramTree', 'ngram'], ['modelTree', 'model'], ['eagleTree', 'eagle3']]) {
    const m0 = await metrics(servers[name].url);
    const spec = await completeAll(servers[name]);
    const m1 = await metrics(servers[name].url);
    for (let i = 0; i < PROMPTS.length; ++i) assert.equal(spec[i], plain[i], `request ${i} with ${kind} trees`);
    const delta = (k) => (m1[k] ?? 0) - (m0[k] ?? 0);
    const nodes = delta('tandem_tree_nodes_verified_total');
    // Tree nodes are drafts too; n-gram trees carry no scores, so every one proposed is verified (the repeated
    // prompts give lookup continuations), while the draft model's and EAGLE-3's are cut to what pays on this
    // machine.
    assert.ok(nodes <= delta('tandem_draft_tokens_total'), `${kind}: ${nodes} tree nodes`);
    assert.equal(delta(`tandem_drafter_tokens_total{drafter="${kind}"}`), delta('tandem_draft_tokens_total'));
    if (kind === 'ngram') assert.ok(nodes > 0, 'n-gram trees: no tree node verified');
  }
});
