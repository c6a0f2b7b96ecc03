package openaie2e

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestOfficialOpenAIGoClient drives Sluice with the official OpenAI Go
// SDK, unchanged: a completion, a stream with usage, a cancelled stream
// (aborted upstream), and a budget refusal surfaced as the SDK's 429
// *openai.Error and sent once although the client retries.
func TestOfficialOpenAIGoClient(t *testing.T) {
	scfg := sim.DefaultConfig()
	scfg.DecodeStep = 10 * time.Millisecond // slow enough to cancel mid-stream
	scfg.OutputLenMin, scfg.OutputLenMax = 150, 200
	rep, repURL := startSim(t, scfg)
	n := startNode(t, nodeConfig(t, repURL))
	client := func(key string) openai.Client {
		return openai.NewClient(option.WithBaseURL(n.api+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(2))
	}
	acme := client(keyAcme)
	ctx := context.Background()
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something short.")}

	var raw *http.Response
	cc, err := acme.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: scfg.Model, Messages: msgs, MaxTokens: openai.Int(8)},
		option.WithResponseInto(&raw))
	require.NoError(t, err)
	assert.NotEmpty(t, raw.Header.Get("X-Request-Id"))
	require.Len(t, cc.Choices, 1)
	assert.NotEmpty(t, cc.Choices[0].Message.Content)
	assert.True(t, cc.Usage.CompletionTokens >= 1 && cc.Usage.CompletionTokens <= 8, "completion_tokens %d", cc.Usage.CompletionTokens)

	stream := acme.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: scfg.Model, Messages: msgs, MaxTokens: openai.Int(12),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	require.NoError(t, stream.Err())
	assert.NotEmpty(t, acc.Choices[0].Message.Content)
	assert.True(t, acc.Usage.CompletionTokens >= 1 && acc.Usage.CompletionTokens <= 12, "streamed usage %d", acc.Usage.CompletionTokens)
	assert.Positive(t, acc.Usage.PromptTokens)

	cctx, cancel := context.WithCancel(ctx)
	cs := acme.Chat.Completions.NewStreaming(cctx, openai.ChatCompletionNewParams{Model: scfg.Model, Messages: msgs, MaxTokens: openai.Int(180)})
	for chunks := 0; cs.Next(); {
		if chunks++; chunks == 3 {
			cancel()
			break
		}
	}
	_ = cs.Close()
	cancel()
	eventually(t, "the simulator aborts the cancelled stream", func() bool {
		s := rep.Stats()
		return s.Aborted == 1 && s.Running == 0
	})

	limited := client(keyLimited)
	_, err = limited.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: scfg.Model, Messages: msgs, MaxTokens: openai.Int(4)})
	require.NoError(t, err)
	_, err = limited.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: scfg.Model, Messages: msgs, MaxTokens: openai.Int(4)})
	var apiErr *openai.Error
	require.True(t, errors.As(err, &apiErr), "want *openai.Error, got %T: %v", err, err)
	assert.Equal(t, 429, apiErr.StatusCode)
	assert.Equal(t, "tenant_budget_exceeded", apiErr.Code)
	assert.Equal(t, "false", apiErr.Response.Header.Get("x-should-retry"))
	eventually(t, "settled", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"dimension": "tokens"}) == 0
	})
	assert.InDelta(t, 2.0, n.metric(t, "sluice_requests_total", map[string]string{"tenant": "limited"}), 1e-9, "the refused call was sent once")
	assert.InDelta(t, 1.0, n.metric(t, "sluice_upstream_aborts_total", map[string]string{"cause": "client_disconnect"}), 1e-9)
	assert.Equal(t, int64(4), rep.Stats().Received, "acme's three calls and limited's first")
}
