package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// Entry is one line of a custom dataset (vLLM's `--dataset-name custom`
// JSONL): a text prompt or token ids, the output length, and optionally the
// tenant it belongs to ("" = any tenant).
type Entry struct {
	Prompt    string `json:"prompt,omitempty"`
	PromptIDs []int  `json:"prompt_ids,omitempty"`
	OutputLen int    `json:"output_len"`
	Tenant    string `json:"tenant,omitempty"`
}

// InputLen is the prompt length in tokens: exact for token ids, else an
// estimate of one token per 4 bytes (no tokenizer in Go; usage confirms).
func (e *Entry) InputLen() int {
	if len(e.PromptIDs) > 0 {
		return len(e.PromptIDs)
	}
	return max(1, (len(e.Prompt)+3)/4)
}

// ParseDataset reads custom-dataset JSONL. Unknown fields are errors; every
// bad line is reported with its number.
func ParseDataset(data []byte) ([]Entry, error) {
	var out []Entry
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e Entry
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		switch err := dec.Decode(&e); {
		case err != nil:
			errs = append(errs, fmt.Errorf("line %d: %w", n, err))
		case (e.Prompt == "") == (len(e.PromptIDs) == 0):
			errs = append(errs, fmt.Errorf("line %d: exactly one of prompt and prompt_ids is required", n))
		case e.OutputLen < 1:
			errs = append(errs, fmt.Errorf("line %d: output_len must be >= 1", n))
		default:
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if len(out) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("no entries"))
	}
	return out, errors.Join(errs...)
}

// LoadDataset reads a custom-dataset JSONL file.
func LoadDataset(path string) ([]Entry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	d, err := ParseDataset(b)
	if err != nil {
		return nil, fmt.Errorf("dataset %s: %w", path, err)
	}
	return d, nil
}
