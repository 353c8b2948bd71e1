// The chat page at `/` in headless Chromium: it loads without the API key and asks for it, streams a reply
// that matches the API's own answer (with its token count, tokens/s and the drafters' acceptance), stops a
// reply mid-stream (the server cancels the generation), and shows the server's errors. Set
// TANDEM_SCREENSHOT_DIR to keep screenshots of the page.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { startServer, metrics, sleep, MODEL_NAME } from '../server/harness.mjs';

const KEY = 'page-test-key';
const CTX = 2048;
let server;
let browser;
let page;
const outsideRequests = [];  // requests the page made to anywhere but the server
const policyViolations = [];  // console messages about the Content-Security-Policy

before(async () => {
  server = await startServer(['-c', String(CTX), '--api-key', KEY, '--draft', 'ngram']);
  browser = await chromium.launch({ executablePath: process.env.TANDEM_CHROMIUM, headless: true });
  page = await browser.newPage({ viewport: { width: 1000, height: 760 } });
  page.setDefaultTimeout(60000);
  page.on('request', (r) => {
    if (!r.url().startsWith(`${server.url}/`)) outsideRequests.push(r.url());
  });
  page.on('console', (m) => {
    if (/Content.Security.Policy/i.test(m.text())) policyViolations.push(m.text());
  });
});

after(async () => {
  await browser?.close();
  if (server) {
    const { code } = await server.stop();
    assert.equal(code, 0, `the server should exit 0 after SIGTERM:\n${server.log()}`);
  }
});

async function screenshot(name) {
  const dir = process.env.TANDEM_SCREENSHOT_DIR;
  if (dir) await page.screenshot({ path: path.join(dir, `${name}.png`), fullPage: true });
}

const auth = { Authorization: `Bearer ${KEY}` };

async function draftCounters() {
  const m = await metrics(server.url, auth);
  return { drafted: m.tandem_draft_tokens_total, accepted: m.tandem_draft_accepted_total };
}

async function setField(selector, value) {
  await page.fill(selector, String(value));
}

// Sends text from the message box with Enter, as a user would.
async function sendMessage(text) {
  await page.fill('#prompt', text);
  await page.press('#prompt', 'Enter');
}

const lastReply = () => page.locator('.msg.assistant').last();

test('the page loads without the key and asks for it', async () => {
  const res = await page.goto(`${server.url}/`);
  assert.equal(res.status(), 200);
  assert.match(res.headers()['content-type'], /^text\/html/);
  assert.match(res.headers()['content-security-policy'], /connect-src 'self'/);
  assert.equal(await page.title(), 'Tandem chat');
  const error = page.locator('#error');
  await error.waitFor({ state: 'visible' });
  assert.match(await error.textContent(), /Incorrect or missing API key.*Enter the server's API key/);
  assert.equal(await page.textContent('#model'), 'Not connected');
  // Every control can be reached by its accessible name.
  for (const name of ['API key', 'Temperature', 'Max tokens', 'Message'])
    assert.equal(await page.getByLabel(name).count(), 1, name);
  for (const name of ['Send', 'Stop', 'New chat'])
    assert.equal(await page.getByRole('button', { name }).count(), 1, name);
  assert.equal(await page.getByRole('log', { name: 'Conversation' }).count(), 1);
  await screenshot('1-no-key');
});

test('a wrong key is reported, the right one connects', async () => {
  await setField('#key', 'not-the-key');
  await page.press('#key', 'Tab');  // the change event
  await page.waitForFunction(() => /Incorrect or missing API key/.test(document.getElementById('error').textContent));
  await setField('#key', KEY);
  await page.press('#key', 'Tab');
  await page.waitForFunction((name) => document.getElementById('model').textContent === `Model: ${name}`, MODEL_NAME);
  assert.equal(await page.isVisible('#error'), false);
});

test('a reply streams in, matches the API and shows its figures', async () => {
  await setField('#temperature', 0);
  await setField('#max-tokens', 150);
  const prompt = 'Once upon a time';
  const before = await draftCounters();
  await sendMessage(prompt);
  const reply = lastReply();
  const stats = reply.locator('.stats');
  await page.waitForFunction(() => {
    const s = [...document.querySelectorAll('.msg.assistant .stats')].pop();
    return s && s.textContent !== '';
  });
  const after = await draftCounters();
  const shown = await reply.locator('.text').textContent();
  const figures = await stats.textContent();

  // The same request, whole, through the API: greedy decoding gives the same text.
  const res = await fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { ...auth, 'Content-Type': 'application/json' },
    body: JSON.stringify({
      model: MODEL_NAME, messages: [{ role: 'user', content: prompt }], temperature: 0, max_tokens: 150,
    }),
  });
  assert.equal(res.status, 200);
  const whole = await res.json();
  assert.ok(shown.length > 0, 'the reply should not be empty');
  assert.equal(shown, whole.choices[0].message.content);

  const n = whole.usage.completion_tokens;
  const m = figures.match(/^(\d+) tokens in ([\d.]+) s · ([\d.]+) tokens\/s · first token after ([\d.]+) s/);
  assert.ok(m, `figures: ${figures}`);
  assert.equal(Number(m[1]), n);
  assert.ok(Number(m[3]) > 0, figures);
  assert.ok(Number(m[4]) <= Number(m[2]), figures);
  assert.equal(figures.includes('cut at max tokens'), whole.choices[0].finish_reason === 'length', figures);
  // Acceptance: shown exactly when the drafters proposed tokens during the reply, as the server counted them.
  const drafted = after.drafted - before.drafted;
  const accepted = after.accepted - before.accepted;
  if (drafted > 0) {
    assert.ok(
      figures.endsWith(`drafts accepted ${accepted}/${drafted} (${Math.round((100 * accepted) / drafted)}%)`),
      figures,
    );
  } else {
    assert.ok(!figures.includes('drafts'), figures);
  }
  assert.equal(await page.isDisabled('#send'), false);
  assert.equal(await page.isDisabled('#stop'), true);
  await screenshot('2-reply');
});

test('stop ends a reply mid-stream and the chat goes on', async () => {
  await page.click('#new-chat');
  assert.equal(await page.locator('.msg').count(), 0);
  await setField('#temperature', 0.8);
  await setField('#max-tokens', CTX - 64);  // far more than arrives before the stop
  const finishedBefore = await metrics(server.url, auth);
  await sendMessage('Tell me a long story about a dog');
  const text = lastReply().locator('.text');
  // Streamed: part of the reply is on the page while the request is still running.
  await page.waitForFunction(() => {
    const t = [...document.querySelectorAll('.msg.assistant .text')].pop();
    return t && t.textContent.length >= 20;
  });
  assert.equal(await page.isDisabled('#stop'), false, 'the reply should still be running');
  assert.equal(await page.isDisabled('#send'), true);
  await page.getByRole('button', { name: 'Stop' }).click();
  const stats = lastReply().locator('.stats');
  await page.waitForFunction(() => {
    const s = [...document.querySelectorAll('.msg.assistant .stats')].pop();
    return s && s.textContent !== '';
  });
  assert.match(await stats.textContent(), /^Stopped after [\d.]+ s/);
  assert.equal(await page.isDisabled('#send'), false);
  assert.equal(await page.isDisabled('#stop'), true);
  const stoppedText = await text.textContent();
  assert.ok(stoppedText.length >= 20);
  await sleep(500);
  assert.equal(await text.textContent(), stoppedText, 'no text may arrive after the stop');

  // The server sees the connection close and cancels the generation well before max_tokens.
  const cancelled = 'tandem_finished_requests_total{reason="cancelled"}';
  let m;
  for (let i = 0; i < 100; ++i) {
    m = await metrics(server.url, auth);
    if (m[cancelled] > finishedBefore[cancelled]) break;
    await sleep(100);
  }
  assert.equal(m[cancelled], finishedBefore[cancelled] + 1, 'the server should cancel the stopped reply');
  const generated = m.tandem_generated_tokens_total - finishedBefore.tandem_generated_tokens_total;
  assert.ok(generated < CTX - 64, `generated ${generated} tokens`);
  await screenshot('3-stopped');

  // The stopped reply is part of the conversation, and the next one completes.
  await setField('#max-tokens', 8);
  await sendMessage('And then?');
  await page.waitForFunction(() => {
    const s = [...document.querySelectorAll('.msg.assistant .stats')].pop();
    return document.querySelectorAll('.msg.assistant').length === 2 && s.textContent !== '';
  });
  assert.match(await lastReply().locator('.stats').textContent(), /^8 tokens in .* · cut at max tokens/);
});

test('errors from the server are shown and the message is kept for a retry', async () => {
  await page.click('#new-chat');
  await setField('#max-tokens', 100000);
  await sendMessage('Hello there');
  const error = page.locator('#error');
  await error.waitFor({ state: 'visible' });
  assert.match(await error.textContent(), /maximum context length is 2048 tokens/);
  assert.equal(await page.locator('.msg.assistant').count(), 0, 'a failed reply leaves no empty bubble');
  assert.match(await page.locator('.msg.user .stats').textContent(), /Not sent/);
  assert.equal(await page.inputValue('#prompt'), 'Hello there');
  assert.equal(await page.isDisabled('#send'), false);
  await screenshot('4-error');

  // The retry with a valid setting clears the error and succeeds; the failed message was not sent twice.
  await setField('#max-tokens', 4);
  await page.press('#prompt', 'Enter');
  await page.waitForFunction(() => {
    const s = [...document.querySelectorAll('.msg.assistant .stats')].pop();
    return s && s.textContent !== '';
  });
  assert.equal(await page.isVisible('#error'), false);
  assert.match(await lastReply().locator('.stats').textContent(), /^4 tokens in /);
  assert.equal(await page.evaluate('messages.length'), 2, 'one user message and its reply');
});

test('the page fetched nothing from elsewhere and broke no policy', () => {
  assert.deepEqual(outsideRequests, []);
  assert.deepEqual(policyViolations, []);
});
