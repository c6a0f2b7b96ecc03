// The official openai npm package's embeddings and responses APIs through
// Sluice. Same environment as ../openai.test.js; test/openaie2e runs this
// file on its own (TestOpenAINodeEndpoints) and checks the server side.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (see the header of ../openai.test.js)`);
  return v;
};

const model = process.env.SLUICE_MODEL || 'sim-model';
let client;

before(() => {
  client = new OpenAI({ apiKey: env('SLUICE_API_KEY'), baseURL: env('SLUICE_BASE_URL'), maxRetries: 2 });
});

test('embeddings.create (the SDK asks for base64 and decodes it)', async () => {
  const res = await client.embeddings.create({ model, input: ['one two', 'three'] });
  assert.equal(res.object, 'list');
  assert.equal(res.data.length, 2);
  for (const [i, d] of res.data.entries()) {
    assert.equal(d.index, i);
    assert.ok(d.embedding.length > 0, 'empty embedding');
    assert.ok(d.embedding.every((x) => typeof x === 'number' && x >= -1 && x <= 1));
  }
  assert.ok(res.usage.prompt_tokens >= 3, `prompt_tokens ${res.usage.prompt_tokens}`);
  assert.equal(res.usage.total_tokens, res.usage.prompt_tokens);
});

test('responses.create, not streamed', async () => {
  const res = await client.responses.create({ model, input: 'Say something short.', max_output_tokens: 8 });
  assert.equal(res.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(res.status), `status ${res.status}`);
  assert.equal(typeof res.output_text, 'string');
  assert.ok(res.output_text.length > 0, 'empty output_text');
  assert.ok(res.usage.output_tokens >= 1 && res.usage.output_tokens <= 8, `output_tokens ${res.usage.output_tokens}`);
  assert.equal(res.usage.total_tokens, res.usage.input_tokens + res.usage.output_tokens);
});

test('responses.create, streamed', async () => {
  const stream = await client.responses.create({
    model, instructions: 'Be brief.', input: [{ role: 'user', content: 'Hello' }], max_output_tokens: 6, stream: true,
  });
  let text = '';
  let completed;
  for await (const ev of stream) {
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed') completed = ev.response;
  }
  assert.ok(completed, 'no response.completed event');
  assert.ok(text.length > 0, 'no text deltas');
  assert.equal(text.trim().split(/\s+/).length, completed.usage.output_tokens);
});

test('a responses stream cancelled with an AbortController stops upstream', async () => {
  const controller = new AbortController();
  const stream = await client.responses.create(
    { model, input: 'Write a long story.', max_output_tokens: 150, stream: true },
    { signal: controller.signal },
  );
  let deltas = 0;
  try {
    for await (const ev of stream) {
      if (ev.type === 'response.output_text.delta' && ++deltas === 3) controller.abort();
    }
  } catch (err) {
    // The SDK may end the iteration quietly or throw its abort error.
    assert.ok(err.name === 'AbortError' || err instanceof OpenAI.APIUserAbortError, `unexpected ${err}`);
  }
  assert.ok(controller.signal.aborted, `the stream ended after ${deltas} deltas, before the cancel`);
  assert.ok(deltas >= 3 && deltas < 150, `${deltas} deltas`);
  const metrics = process.env.SLUICE_METRICS_URL;
  if (metrics) {
    // Sluice counts the abort while this process is still alive.
    for (let i = 0; i < 200; i++) {
      const body = await (await fetch(metrics)).text();
      const n = body.split('\n')
        .filter((l) => l.startsWith('sluice_upstream_aborts_total{') && l.includes('cause="client_disconnect"'))
        .reduce((sum, l) => sum + Number(l.split(' ').pop()), 0);
      if (n === 1) return;
      await new Promise((r) => setTimeout(r, 25));
    }
    assert.fail('Sluice never counted the abort');
  }
});
