// Package openaie2e drives Sluice with the official openai npm package
// (test/openai-node) as an outside client: its test starts a simulated
// vLLM replica and a Sluice node in process, runs `node --test` against
// them and then checks the server side of what the client did (the
// cancelled stream was aborted upstream, holds were released, the 429 was
// not retried). It needs Node.js 20 or later; node_modules is installed
// with `npm ci` when missing (scripts/npm-deps.sh does the same).
package openaie2e
