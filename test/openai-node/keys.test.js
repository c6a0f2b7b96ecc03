// The honest output cap seen through the official openai npm package: a
// max_tokens the budget cannot cover is never silently truncated. With held
// predictions (Sluice's default) it runs on its prediction and, when the
// budget cannot grow its hold, is stopped at the budget with
// finish_reason "length" and X-Sluice-Stopped saying so, answered once.
//
// Environment (besides openai.test.js's SLUICE_BASE_URL and SLUICE_MODEL):
//   SLUICE_CAPPED_KEY  a tenant whose only budget is {tokens: 600 per 24h}
//                      and whose max_output_tokens is at least 1000, unused
//                      before this run (optional: the test skips without it)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const model = process.env.SLUICE_MODEL || 'sim-model';
const messages = [{ role: 'user', content: 'Write a long story.' }];

test('max_tokens over the budget runs and is stopped at the budget, not truncated silently', { skip: !process.env.SLUICE_CAPPED_KEY }, async () => {
  let attempts = 0;
  const capped = new OpenAI({
    apiKey: process.env.SLUICE_CAPPED_KEY,
    baseURL: process.env.SLUICE_BASE_URL,
    maxRetries: 2,
    fetch: (url, init) => {
      attempts++;
      return fetch(url, init);
    },
  });
  const { data, response } = await capped.chat.completions
    .create({ model, messages, max_tokens: 1000, ignore_eos: true })
    .withResponse();
  assert.equal(attempts, 1, 'answered once');
  assert.equal(data.choices[0].finish_reason, 'length');
  assert.match(response.headers.get('x-sluice-stopped') ?? '', /^budget; scope=tenant; dimension=tokens; window=24h/);
  assert.ok(data.usage.completion_tokens > 0 && data.usage.completion_tokens < 1000, `completion_tokens ${data.usage.completion_tokens}`);
  assert.equal(response.headers.get('x-sluice-output-cap'), null, 'the client cap was sent as asked');
});
