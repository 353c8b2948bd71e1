// serve --expert-budget on a mixture-of-experts model: the scheduler's forwards read the routed experts
// through the residency, and /metrics shows its counters after a completion.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { startServer, metrics, SHARED } from './harness.mjs';

const MOE = path.join(SHARED, 'models', 'synth', 'synth-qwen2moe-d128-Q8_0.gguf');
const MOE_NAME = 'synth-qwen2moe-d128-Q8_0';
let server;

before(async () => {
  server = await startServer(['--expert-budget', '50%', '-t', '1'], MOE);
});

after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

test('/metrics shows the expert residency after a completion', async () => {
  assert.match(server.log(), /serve: expert budget [0-9.]+ MB: \d+ of \d+ routed experts resident at once/);
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MOE_NAME, prompt: [1, 40, 41, 42, 7, 9], max_tokens: 32, temperature: 0,
      ignore_eos: true }),
  });
  assert.equal(res.status, 200, await res.text());
  const m = await metrics(server.url);
  const budget = m.tandem_expert_budget_bytes;
  assert.ok(budget > 0, `budget ${budget}`);
  assert.ok(m.tandem_expert_resident_bytes > 0 && m.tandem_expert_resident_bytes <= budget,
    `resident ${m.tandem_expert_resident_bytes} of ${budget}`);
  assert.ok(m.tandem_expert_resident_experts > 0);
  assert.ok(m.tandem_expert_resident_experts < m.tandem_expert_routed_experts);
  assert.ok(m.tandem_expert_reads_resident_total > 0);
  assert.ok(m.tandem_expert_reads_resident_total < m.tandem_expert_reads_total);
  const bytes = m.tandem_expert_read_bytes_total;
  const resident = m.tandem_expert_read_bytes_resident_total;
  assert.ok(resident > 0 && resident < bytes, `${resident} of ${bytes}`);
  assert.ok(Math.abs(m.tandem_expert_read_bytes_resident_fraction - resident / bytes) < 1e-5);
});
