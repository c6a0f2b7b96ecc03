package redisledger

import (
	"encoding/base64"
	"testing"

	"github.com/sluicehq/sluice/ledger"
)

// TestKeySlot: the batcher groups operations by the Cluster slot Redis
// computes (values from the Cluster specification and CLUSTER KEYSLOT).
func TestKeySlot(t *testing.T) {
	for key, want := range map[string]uint16{
		"foo":                  12182,
		"123456789":            0x31C3 & 16383,
		"{user1000}.following": keySlot("user1000"),
		"{user1000}.followers": keySlot("user1000"),
		"foo{}{bar}":           keySlot("foo{}{bar}"), // an empty tag hashes the whole key
		"sluice:{T}:q:x":       keySlot("T"),
	} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
	if keySlot("foo{}{bar}") == keySlot("bar") {
		t.Error("an empty first tag must not fall through to the second")
	}
}

// TestEncID: the record id text is the unpadded base64url of the id, as
// EncodeToString writes it.
func TestEncID(t *testing.T) {
	for range 100 {
		id := ledger.NewRequestID()
		if got, want := encID(id), base64.RawURLEncoding.EncodeToString(id[:]); got != want {
			t.Fatalf("encID = %q, want %q", got, want)
		}
	}
}
