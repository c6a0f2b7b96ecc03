// The official Anthropic TypeScript SDK as an outside client of Sluice's
// /v1/messages and /v1/messages/count_tokens.
//
// Environment:
//   SLUICE_ANTHROPIC_URL  the API root, e.g. http://127.0.0.1:8080 (required)
//   SLUICE_API_KEY        a tenant with room in its budgets (required)
//   SLUICE_LIMITED_KEY    a tenant whose only budget is {requests: 1 per 1h},
//                         unused before this run (required)
//   SLUICE_METRICS_URL    the admin listener's /metrics (optional: the cancel
//                         test then waits for Sluice to count the abort)
//   SLUICE_MODEL          the served model (default sim-model)
//
// test/openaie2e runs this file against an in-process Sluice and simulator
// and checks the server side.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (see the header of messages.test.js)`);
  return v;
};

const model = process.env.SLUICE_MODEL || 'sim-model';
const messages = [{ role: 'user', content: 'Say something short.' }];
let baseURL, client;

before(() => {
  baseURL = env('SLUICE_ANTHROPIC_URL');
  // maxRetries 2: a refusal wrongly retried would show up as extra requests.
  client = new Anthropic({ apiKey: env('SLUICE_API_KEY'), baseURL, maxRetries: 2 });
});

test('non-streamed message', async () => {
  const { data, response } = await client.messages
    .create({ model, messages, max_tokens: 8, system: 'Be brief.' })
    .withResponse();
  assert.equal(response.status, 200);
  assert.ok(response.headers.get('x-request-id'), 'X-Request-Id missing');
  assert.equal(data.type, 'message');
  assert.equal(data.role, 'assistant');
  assert.equal(data.content[0].type, 'text');
  assert.ok(data.content[0].text.length > 0, 'empty text');
  assert.ok(['end_turn', 'max_tokens'].includes(data.stop_reason), `stop_reason ${data.stop_reason}`);
  assert.ok(data.usage.input_tokens >= 1, `input_tokens ${data.usage.input_tokens}`);
  assert.ok(data.usage.output_tokens >= 1 && data.usage.output_tokens <= 8, `output_tokens ${data.usage.output_tokens}`);
});

test('streamed message with usage', async () => {
  const stream = client.messages.stream({ model, messages, max_tokens: 12 });
  let text = '';
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.ok(text.length > 0, 'no text streamed');
  assert.equal(final.content[0].text, text);
  assert.ok(final.usage.input_tokens >= 1, `input_tokens ${final.usage.input_tokens}`);
  assert.ok(final.usage.output_tokens >= 1 && final.usage.output_tokens <= 12, `output_tokens ${final.usage.output_tokens}`);
});

test('count_tokens', async () => {
  const r = await client.messages.countTokens({ model, messages });
  assert.ok(r.input_tokens >= 1, `input_tokens ${r.input_tokens}`);
});

test('cancelling a stream aborts it', async () => {
  const ac = new AbortController();
  const stream = await client.messages.create(
    { model, messages, max_tokens: 180, stream: true },
    { signal: ac.signal },
  );
  let deltas = 0;
  try {
    for await (const ev of stream) {
      if (ev.type === 'content_block_delta' && ++deltas === 3) {
        ac.abort();
        break;
      }
    }
  } catch (err) {
    assert.ok(err instanceof Anthropic.APIUserAbortError || err.name === 'AbortError', `${err}`);
  }
  assert.equal(deltas, 3);
  const metrics = process.env.SLUICE_METRICS_URL;
  if (metrics) {
    for (let i = 0; i < 200; i++) {
      const body = await (await fetch(metrics)).text();
      if (/sluice_upstream_aborts_total\{[^}]*cause="client_disconnect"[^}]*\} 1/.test(body)) return;
      await new Promise((r) => setTimeout(r, 25));
    }
    assert.fail('Sluice never counted the abort');
  }
});

test('a budget refusal is a RateLimitError, sent once', async () => {
  const limited = new Anthropic({ apiKey: env('SLUICE_LIMITED_KEY'), baseURL, maxRetries: 2 });
  await limited.messages.create({ model, messages, max_tokens: 4 });
  await assert.rejects(
    limited.messages.create({ model, messages, max_tokens: 4 }),
    (err) => {
      assert.ok(err instanceof Anthropic.RateLimitError, `got ${err.constructor.name}: ${err.message}`);
      assert.equal(err.status, 429);
      assert.equal(err.error.type, 'error');
      assert.equal(err.error.error.type, 'rate_limit_error');
      assert.equal(err.error.error.code, 'tenant_budget_exceeded');
      assert.equal(err.headers.get('x-should-retry'), 'false');
      return true;
    },
  );
});

test('an unknown key is an AuthenticationError', async () => {
  const bad = new Anthropic({ apiKey: 'sk-nobody', baseURL, maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model, messages, max_tokens: 4 }), Anthropic.AuthenticationError);
});
