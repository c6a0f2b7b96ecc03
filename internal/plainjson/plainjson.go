// Package plainjson encodes the JSON bodies Sluice writes itself (error
// shapes, the model list, admin answers) the way vLLM and OpenAI write
// theirs: without encoding/json's HTML escaping, so that a message such as
// "weight must be >= 1" reads as written.
package plainjson

import (
	"bytes"
	"encoding/json"
)

// Marshal encodes v as one line of JSON, without HTML escaping and without
// a trailing newline.
func Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
