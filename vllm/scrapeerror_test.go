package vllm

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestShowErrorDropsCredentials: what the status page shows of a failed
// scrape names neither a URL's userinfo nor a bearer value.
func TestShowErrorDropsCredentials(t *testing.T) {
	dial := errors.New("dial tcp 10.0.0.7:8000: connect: connection refused")
	ue := &url.Error{Op: "Get", URL: "http://ops:hunter2@10.0.0.7:8000/metrics", Err: dial}
	assert.Equal(t, dial.Error(), ShowError(ue))
	assert.Equal(t, "timed out", ShowError(&url.Error{Op: "Get", URL: "http://u:p@h/health", Err: context.DeadlineExceeded}))
	up := fmt.Errorf("models http://ops:hunter2@h: %w", &UpstreamError{Replica: "http://ops:hunter2@h", Status: 401, Type: "Unauthorized"})
	assert.Equal(t, "status 401 Unauthorized", ShowError(up))
	assert.Equal(t, "fetch https://h:1/x: Authorization: Bearer [redacted]",
		ShowError(errors.New("fetch https://ops:hunter2@h:1/x: Authorization: Bearer sk-123")))
	assert.Equal(t, "http://10.0.0.7:8000/v1", RedactURL("http://ops:hunter2@10.0.0.7:8000/v1"))
	assert.Equal(t, "http://10.0.0.7:8000", RedactURL("http://10.0.0.7:8000"))
}
