// The official openai npm package as an outside client of Sluice.
//
// Environment:
//   SLUICE_BASE_URL     the API, e.g. http://127.0.0.1:8080/v1 (required)
//   SLUICE_API_KEY      a tenant with room in its budgets (required)
//   SLUICE_LIMITED_KEY  a tenant whose only budget is {requests: 1 per 1h},
//                       unused before this run (required)
//   SLUICE_METRICS_URL  the admin listener's /metrics (optional; when set the
//                       abort test also waits for Sluice to count the abort
//                       while this process is still alive)
//   SLUICE_MODEL        the served model (default sim-model)
//   SLUICE_DIRECT_URL   the replica behind Sluice, e.g. http://127.0.0.1:8100/v1
//                       (optional; when set the transparency tests send each
//                       request to it directly too and compare)
//
// test/openaie2e runs this file against an in-process Sluice and simulator
// and checks the server side; `npm test` runs it against any Sluice.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (see the header of openai.test.js)`);
  return v;
};

const model = process.env.SLUICE_MODEL || 'sim-model';
const messages = [{ role: 'user', content: 'Say something short.' }];
let baseURL, client;

before(() => {
  baseURL = env('SLUICE_BASE_URL');
  // maxRetries 2 everywhere: a refusal that was wrongly retried would show
  // up as extra requests.
  client = new OpenAI({ apiKey: env('SLUICE_API_KEY'), baseURL, maxRetries: 2 });
});

test('models.list names the served model', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes(model), `models ${JSON.stringify(ids)} lack ${model}`);
});

test('non-streamed chat completion', async () => {
  const { data, response, request_id } = await client.chat.completions
    .create({ model, messages, max_tokens: 8 })
    .withResponse();
  assert.equal(response.status, 200);
  assert.ok(request_id, 'X-Request-Id missing');
  assert.equal(data.object, 'chat.completion');
  assert.equal(data.choices.length, 1);
  const [choice] = data.choices;
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.ok(choice.message.content.length > 0, 'empty content');
  assert.ok(['stop', 'length'].includes(choice.finish_reason), `finish_reason ${choice.finish_reason}`);
  const u = data.usage;
  assert.ok(u.completion_tokens >= 1 && u.completion_tokens <= 8, `completion_tokens ${u.completion_tokens} not in [1,8]`);
  assert.ok(u.prompt_tokens >= 1, `prompt_tokens ${u.prompt_tokens}`);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
});

test('streamed chat completion with include_usage', async () => {
  const stream = await client.chat.completions.create({
    model,
    messages,
    max_tokens: 16,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let contentChunks = 0;
  let finish = null;
  const usageAt = [];
  const chunks = [];
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    const delta = chunk.choices[0]?.delta?.content;
    if (delta) {
      text += delta;
      contentChunks++;
    }
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
    if (chunk.usage) usageAt.push(chunks.length);
    chunks.push(chunk);
  }
  assert.ok(contentChunks >= 1 && text.length > 0, 'no content deltas');
  assert.ok(['stop', 'length'].includes(finish), `finish_reason ${finish}`);
  assert.deepEqual(usageAt, [chunks.length - 1], `usage must come once, on the last of ${chunks.length} chunks`);
  const final = chunks.at(-1);
  assert.deepEqual(final.choices, [], 'the usage chunk carries no choices');
  const u = final.usage;
  // Tokens may be packed several to a chunk, never fewer than one.
  assert.ok(u.completion_tokens >= contentChunks, `completion_tokens ${u.completion_tokens} < ${contentChunks} content chunks`);
  assert.ok(u.completion_tokens <= 16, `completion_tokens ${u.completion_tokens} > max_tokens 16`);
  assert.ok(u.prompt_tokens >= 1, `prompt_tokens ${u.prompt_tokens}`);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
});

// abortsCounted sums sluice_upstream_aborts_total{cause="client_disconnect"}.
async function abortsCounted(metricsURL) {
  const res = await fetch(metricsURL);
  assert.equal(res.status, 200, `GET ${metricsURL}`);
  let sum = 0;
  for (const line of (await res.text()).split('\n')) {
    if (line.startsWith('sluice_upstream_aborts_total{') && line.includes('cause="client_disconnect"')) {
      sum += Number(line.slice(line.lastIndexOf(' ') + 1));
    }
  }
  return sum;
}

test('a stream cancelled with an AbortController stops upstream', async () => {
  const metricsURL = process.env.SLUICE_METRICS_URL;
  const abortsBefore = metricsURL ? await abortsCounted(metricsURL) : 0;
  const ac = new AbortController();
  const stream = await client.chat.completions.create(
    // ignore_eos (a vLLM extension) makes the stream run to max_tokens, so
    // it is still going when we cancel.
    { model, messages, max_tokens: 200, ignore_eos: true, stream: true },
    { signal: ac.signal },
  );
  const cancelAfter = 3;
  let contentChunks = 0;
  let finish = null;
  let thrown = null;
  try {
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta?.content) contentChunks++;
      if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
      if (contentChunks === cancelAfter && !ac.signal.aborted) ac.abort();
    }
  } catch (err) {
    thrown = err;
  }
  assert.ok(ac.signal.aborted, `the stream ended after ${contentChunks} content chunks, before the cancel`);
  if (thrown) {
    assert.ok(thrown instanceof OpenAI.APIUserAbortError || thrown.name === 'AbortError', `unexpected error: ${thrown}`);
  }
  assert.equal(finish, null, 'the cancelled stream must not reach a finish_reason');
  assert.ok(contentChunks < 200, `got ${contentChunks} content chunks after the cancel`);
  if (metricsURL) {
    // Sluice must see the disconnect now, not when this process exits.
    const deadline = Date.now() + 5000;
    let now = abortsBefore;
    while ((now = await abortsCounted(metricsURL)) <= abortsBefore && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20)); // polling a server counter
    }
    assert.equal(now, abortsBefore + 1, 'Sluice counted no client_disconnect abort within 5s');
  }
});

test('an exhausted budget is a RateLimitError that the SDK does not retry', async () => {
  const attempts = [];
  const limited = new OpenAI({
    apiKey: env('SLUICE_LIMITED_KEY'),
    baseURL,
    maxRetries: 2,
    // Count every HTTP attempt the SDK makes, retries included.
    fetch: (url, init) => {
      attempts.push(String(url));
      return fetch(url, init);
    },
  });
  const body = { model, messages, max_tokens: 4 };

  const { data, response } = await limited.chat.completions.create(body).withResponse();
  assert.ok(data.choices[0].message.content.length > 0);
  assert.equal(response.headers.get('x-ratelimit-limit-requests'), '1');
  assert.equal(response.headers.get('x-ratelimit-remaining-requests'), '0');
  assert.equal(attempts.length, 1);

  await assert.rejects(limited.chat.completions.create(body), (err) => {
    assert.ok(err instanceof OpenAI.RateLimitError, `got ${err?.constructor?.name}: ${err}`);
    assert.equal(err.status, 429);
    assert.equal(err.code, 'tenant_budget_exceeded');
    assert.equal(err.error?.code, 'tenant_budget_exceeded');
    assert.equal(err.error?.details?.dimension, 'requests');
    assert.equal(err.headers.get('x-should-retry'), 'false');
    assert.ok(Number(err.headers.get('retry-after')) > 0, `Retry-After ${err.headers.get('retry-after')}`);
    assert.ok(err.requestID, 'X-Request-Id missing on the 429');
    return true;
  });
  assert.equal(attempts.length, 2, `the SDK sent ${attempts.length - 1} requests for the refused call, want 1`);
});

// Transparency (issue 19): what works against vLLM directly works the same
// through Sluice, for features that only exist without streaming.
const directURL = process.env.SLUICE_DIRECT_URL;
const both = (fn) => async () => {
  const direct = new OpenAI({ apiKey: 'unused', baseURL: directURL, maxRetries: 0 });
  return Promise.all([fn(client), fn(direct)]);
};
const settled = (p) => p.then((v) => ({ ok: v }), (err) => ({ err }));

test('non-streamed prompt_logprobs: 200 through Sluice as direct', { skip: !directURL }, async () => {
  const [via, direct] = await both((c) =>
    c.chat.completions.create({ model, messages, max_tokens: 3, prompt_logprobs: 1 }).withResponse(),
  )();
  for (const { data, response } of [via, direct]) {
    assert.equal(response.status, 200);
    assert.ok(Array.isArray(data.prompt_logprobs), `prompt_logprobs ${JSON.stringify(data.prompt_logprobs)}`);
  }
  assert.equal(via.data.prompt_logprobs.length, direct.data.prompt_logprobs.length);
  assert.equal(via.data.usage.prompt_tokens, direct.data.usage.prompt_tokens);
});

test('beam-search completion: 200 through Sluice as direct', { skip: !directURL }, async () => {
  const [via, direct] = await both((c) =>
    c.completions.create({ model, prompt: 'Once upon a time', max_tokens: 4, n: 2, use_beam_search: true }).withResponse(),
  )();
  for (const { data, response } of [via, direct]) {
    assert.equal(response.status, 200);
    assert.equal(data.object, 'text_completion');
    assert.equal(data.choices.length, 2);
  }
});

test('out-of-range logprobs: the same 400 through Sluice as direct', { skip: !directURL }, async () => {
  const [via, direct] = await both((c) =>
    settled(c.completions.create({ model, prompt: 'Once upon a time', max_tokens: 4, logprobs: 21 })),
  )();
  for (const r of [via, direct]) {
    assert.ok(r.err instanceof OpenAI.BadRequestError, `got ${r.err?.constructor?.name ?? 'success'}`);
    assert.equal(r.err.status, 400);
  }
  assert.equal(via.err.message, direct.err.message);
  assert.deepEqual(via.err.error, direct.err.error);
  assert.match(direct.err.message, /Requested sample logprobs of 21, which is greater than max allowed: 20/);
});
