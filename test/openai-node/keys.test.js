// The honest output cap seen through the official openai npm package: a
// max_tokens the budget cannot fit is a RateLimitError that says how many
// output tokens would fit, never a silently truncated answer.
//
// Environment (besides openai.test.js's SLUICE_BASE_URL and SLUICE_MODEL):
//   SLUICE_CAPPED_KEY  a tenant whose only budget is {tokens: 3000 per 24h}
//                      and whose max_output_tokens is at least 3500, unused
//                      before this run (optional: the test skips without it)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const model = process.env.SLUICE_MODEL || 'sim-model';
const messages = [{ role: 'user', content: 'Write a long story.' }];

test('max_tokens over the budget is refused with what fits, not truncated', { skip: !process.env.SLUICE_CAPPED_KEY }, async () => {
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
  let fits;
  await assert.rejects(capped.chat.completions.create({ model, messages, max_tokens: 3500 }), (err) => {
    assert.ok(err instanceof OpenAI.RateLimitError, `got ${err?.constructor?.name}: ${err}`);
    assert.equal(err.code, 'tenant_budget_exceeded');
    assert.equal(err.error?.details?.scope, 'tenant');
    fits = err.error?.details?.fits_output_tokens;
    assert.ok(Number.isInteger(fits) && fits > 2900 && fits < 3000, `details.fits_output_tokens ${fits}`);
    assert.match(err.message, /output tokens would fit/);
    return true;
  });
  assert.equal(attempts, 1, 'the SDK must not retry the refusal');

  // The refusal held nothing: a request that fits is served as asked, with
  // no output-cap header (nothing was lowered).
  const { data, response } = await capped.chat.completions
    .create({ model, messages, max_tokens: 8, ignore_eos: true })
    .withResponse();
  assert.equal(data.usage.completion_tokens, 8);
  assert.equal(response.headers.get('x-sluice-output-cap'), null);
});
