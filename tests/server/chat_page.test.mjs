// The chat page's route, without a browser (tests/browser drives the page itself): `/` answers the embedded
// HTML without the API key while /v1/* still needs it, under a policy that keeps the page on this server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, metrics } from './harness.mjs';

const KEY = 'route-test-key';
let server;

before(async () => {
  server = await startServer(['--api-key', KEY]);
});

after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, `the server should exit 0 after SIGTERM:\n${server.log()}`);
});

test('GET / answers the page without the key', async () => {
  const res = await fetch(`${server.url}/`);
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'text/html; charset=utf-8');
  const policy = res.headers.get('content-security-policy');
  assert.match(policy, /default-src 'none'/);
  assert.match(policy, /connect-src 'self'/);
  assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
  const html = await res.text();
  assert.match(html, /^<!doctype html>/);
  assert.match(html, /<title>Tandem chat<\/title>/);
  assert.match(html, /\/v1\/chat\/completions/);
  // Self-contained: no script, style or image from elsewhere.
  assert.doesNotMatch(html, /\b(src|href)\s*=\s*["']?(https?:)?\/\//i);
  assert.doesNotMatch(html, /<script[^>]*\bsrc=/i);
});

test('the API still needs the key', async () => {
  assert.equal((await fetch(`${server.url}/v1/models`)).status, 401);
  assert.equal((await fetch(`${server.url}/metrics`)).status, 401);
  const ok = await fetch(`${server.url}/v1/models`, { headers: { Authorization: `Bearer ${KEY}` } });
  assert.equal(ok.status, 200);
});

test('other methods on / get 405 naming GET', async () => {
  const res = await fetch(`${server.url}/`, { method: 'POST', body: '{}' });
  assert.equal(res.status, 405);
  assert.equal(res.headers.get('allow'), 'GET');
  const body = await res.json();
  assert.equal(body.error.code, 'method_not_allowed');
});

test('page loads are counted', async () => {
  const m = await metrics(server.url, { Authorization: `Bearer ${KEY}` });
  assert.equal(m['tandem_requests_total{endpoint="/",status="200"}'], 1);
});
