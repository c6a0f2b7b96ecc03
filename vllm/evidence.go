package vllm

// Reassemblable reports whether a non-streamed request may go upstream as a
// stream (RewriteOptions.StreamInterval) and have its body rebuilt by
// [NewAssembler] exactly as vLLM would have answered it. Every top-level
// member must be one whose effect a stream carries chunk by chunk: the
// prompt, sampling and structured-output parameters, logprobs, the chat
// template's inputs. Anything else keeps the request non-streamed upstream,
// where an abort is charged its hold:
//   - tools, tool_choice, functions, parallel_tool_calls: vLLM's streaming
//     tool parser is not its non-streaming one (different call ids, and a
//     parser may hold chunks back), chat_completion/serving.py;
//   - prompt_logprobs, echo, return_token_ids, return_tokens_as_token_ids,
//     kv_transfer_params: the non-streamed body carries what the chunks
//     do not, or in another shape (completion/serving.py);
//   - use_beam_search, best_of, suffix: vLLM refuses them streamed, or
//     answers them only whole;
//   - stream_options on a non-streamed request: vLLM's 400 is the answer
//     (chat_completion/protocol.py validate_stream_options);
//   - include_reasoning, vllm_xargs, and any member not listed: unknown
//     effect on the response.
//
// A reasoning parser (a server flag, not visible in the request) is
// assembled from the chunks' reasoning deltas, which vLLM's streaming
// parser splits as its non-streaming one does for the parsers it ships.
func (r *Request) Reassemblable() bool {
	if r.Stream || r.HasStreamOptions {
		return false
	}
	b := r.body
	ok := true
	_ = eachMember(b, skipSpace(b, 0), func(m member) bool {
		if m.keyEsc || !reassemblableKey(string(b[m.keyStart+1:m.keyEnd-1]), r.Endpoint) {
			ok = false
			return false
		}
		return true
	})
	return ok
}

// reassemblableKey lists the members a stream carries faithfully
// (vllm/entrypoints/openai/chat_completion/protocol.py and
// completion/protocol.py).
func reassemblableKey(k string, e Endpoint) bool {
	switch k {
	case "model", "n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
		"stop", "stop_token_ids", "frequency_penalty", "presence_penalty", "repetition_penalty",
		"length_penalty", "ignore_eos", "min_tokens", "logit_bias", "allowed_token_ids", "bad_words",
		"skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
		"user", "priority", "request_id", "cache_salt", "truncate_prompt_tokens",
		"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
		"guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern",
		"stream", "stream_interval", "add_special_tokens", "logprobs",
		"repetition_detection", "thinking_token_budget", "mm_processor_kwargs":
		return true
	}
	if e == EndpointChat {
		switch k {
		case "messages", "max_completion_tokens", "top_logprobs", "chat_template",
			"chat_template_kwargs", "add_generation_prompt", "continue_final_message",
			"documents", "reasoning_effort":
			return true
		}
		return false
	}
	return k == "prompt"
}
