// Tool-call formats and reasoning end to end, each through the model family's own published template
// (--chat-template): with tool_choice "required" the grammar writes that family's call syntax, which the
// server parses back into OpenAI tool_calls whose arguments validate (ajv), streamed and non-streamed alike;
// the calls and the tool's answer render back through the template. DeepSeek R1's template opens <think> in
// the prompt, so its reply is reasoning_content unless reasoning_format is "none". Templates that run away
// or break answer 400 with an error object, and the server goes on.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { startServer, SHARED, MODEL_NAME } from './harness.mjs';

const TEMPLATES = path.join(SHARED, 'chat', 'templates');
const FAMILIES = {
  // raw: the reply's text (its tokens, from logprobs) in the family's syntax.
  mistral: { file: 'mistralai-Mistral-Nemo-Instruct-2407.jinja', id: /^[a-zA-Z0-9]{9}$/,
    raw: /^\[\{"name": "get_weather", "arguments": \{/ },
  llama3: { file: 'meta-llama-Llama-3.1-8B-Instruct.jinja', id: /^call_/,
    raw: /^\{"name": "get_weather", "parameters": \{/ },
  functionary: { file: 'meetkai-functionary-medium-v3.2.jinja', id: /^call_/, raw: /^get_weather\n\{/ },
  r1: { file: 'deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja', id: /^call_/, raw: /function.*get_weather\n```json\n\{/ },
  commandr: { file: 'CohereForAI-c4ai-command-r-plus-tool_use.jinja', id: /^call_/,
    raw: /^Action: ```json\n\[\n\{"tool_name": "get_weather", "parameters": \{/ },
};
// Command R+'s template describes every parameter, so each has a description.
const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', description: 'The city', minLength: 1, maxLength: 20 },
        unit: { type: 'string', description: 'The unit', enum: ['celsius', 'fahrenheit'] },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const validateWeather = new Ajv().compile(WEATHER.function.parameters);
const MESSAGES = [{ role: 'user', content: 'What is the weather in Paris?' }];

const servers = {};
const clients = {};
let dir;

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tandem-formats-'));
  fs.writeFileSync(path.join(dir, 'loop.jinja'),
    '{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}');
  fs.writeFileSync(path.join(dir, 'broken.jinja'), '{{ messages[0].content + 1 }}');
  const templates = { ...Object.fromEntries(Object.entries(FAMILIES).map(([k, f]) => [k, path.join(TEMPLATES, f.file)])),
    loop: path.join(dir, 'loop.jinja'), broken: path.join(dir, 'broken.jinja') };
  await Promise.all(Object.entries(templates).map(async ([name, file]) => {
    servers[name] = await startServer(['-t', '1', '-c', '4096', '--parallel', '1', '--chat-template', file]);
    clients[name] = new OpenAI({ baseURL: `${servers[name].url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  }));
});

after(async () => {
  for (const s of Object.values(servers)) {
    const { code } = await s.stop();
    assert.equal(code, 0, `the server should exit 0 after SIGTERM:\n${s.log()}`);
  }
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

// The stream's chunks put together as one message.
async function collect(stream) {
  const out = { content: '', reasoning: '', calls: [], finish: null };
  for await (const chunk of stream)
    for (const c of chunk.choices) {
      out.content += c.delta.content ?? '';
      out.reasoning += c.delta.reasoning_content ?? '';
      for (const d of c.delta.tool_calls ?? []) {
        out.calls[d.index] ??= { id: d.id, type: d.type, function: { name: '', arguments: '' } };
        out.calls[d.index].function.name += d.function?.name ?? '';
        out.calls[d.index].function.arguments += d.function?.arguments ?? '';
      }
      if (c.finish_reason) out.finish = c.finish_reason;
    }
  return out;
}

for (const [family, { id, raw }] of Object.entries(FAMILIES)) {
  test(`${family}: required tool calls parse, validate, stream alike and render back`, async () => {
    const client = clients[family];
    const params = { model: MODEL_NAME, messages: MESSAGES, tools: [WEATHER], tool_choice: 'required',
      parallel_tool_calls: false, temperature: 0, max_tokens: 200 };
    const r = await client.chat.completions.create(params);
    const msg = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r));
    assert.equal(msg.tool_calls.length, 1);
    const call = msg.tool_calls[0];
    assert.match(call.id, id);
    assert.equal(call.function.name, 'get_weather');
    assert.ok(validateWeather(JSON.parse(call.function.arguments)), call.function.arguments);
    const text = (await client.chat.completions.create({ ...params, logprobs: true })).choices[0].logprobs.content
      .map((t) => t.token).join('');
    assert.match(text, raw);

    const streamed = await collect(await client.chat.completions.create({ ...params, stream: true }));
    assert.equal(streamed.finish, 'tool_calls');
    assert.deepEqual(streamed.calls.map((c) => [c.function.name, c.function.arguments]),
      msg.tool_calls.map((c) => [c.function.name, c.function.arguments]));
    assert.equal(streamed.content, msg.content ?? '');

    const followUp = await client.chat.completions.create({
      model: MODEL_NAME, temperature: 0, max_tokens: 8, tools: [WEATHER],
      messages: [...MESSAGES, msg, { role: 'tool', tool_call_id: call.id, content: 'Sunny, 21 C' }],
    });
    assert.equal(typeof followUp.choices[0].message.content, 'string');
  });
}

test('r1: the reply after the prompt\'s <think> is reasoning_content, streamed alike; none keeps it inline', async () => {
  const params = { model: MODEL_NAME, messages: MESSAGES, temperature: 0, max_tokens: 24 };
  const r = await clients.r1.chat.completions.create(params);
  const msg = r.choices[0].message;
  assert.ok(msg.reasoning_content.length > 0, JSON.stringify(msg));
  assert.equal(msg.content, '');
  const streamed = await collect(await clients.r1.chat.completions.create({ ...params, stream: true }));
  assert.equal(streamed.reasoning, msg.reasoning_content);
  assert.equal(streamed.content, '');

  const inline = await clients.r1.chat.completions.create({ ...params, reasoning_format: 'none' });
  assert.equal(inline.choices[0].message.reasoning_content, undefined);
  assert.ok(inline.choices[0].message.content.includes(msg.reasoning_content));
  const inlineStreamed = await collect(await clients.r1.chat.completions.create({ ...params, reasoning_format: 'none', stream: true }));
  assert.equal(inlineStreamed.reasoning, '');
  assert.equal(inlineStreamed.content, inline.choices[0].message.content);
});

test('a template that runs away or breaks is a 400 naming why; the server goes on', async () => {
  for (const [name, says] of [['loop', /StepLimitError/], ['broken', /TypeError/]]) {
    for (const stream of [false, true]) {
      await assert.rejects(
        clients[name].chat.completions.create({ model: MODEL_NAME, messages: MESSAGES, stream }),
        (e) => e.status === 400 && says.test(e.message) && e.param === 'messages', `${name} stream=${stream}`);
    }
    const health = await fetch(`${servers[name].url}/health`);
    assert.equal(health.status, 200, name);
    const completion = await clients[name].completions.create({ model: MODEL_NAME, prompt: 'Once', max_tokens: 4 });
    assert.equal(typeof completion.choices[0].text, 'string');
  }
});
