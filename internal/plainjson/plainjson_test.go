package plainjson

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMarshalKeepsHTMLCharacters(t *testing.T) {
	b, err := Marshal(map[string]string{"message": "weight must be >= 1 & <= 8"})
	require.NoError(t, err)
	assert.Equal(t, `{"message":"weight must be >= 1 & <= 8"}`, string(b))
	_, err = Marshal(func() {})
	assert.Error(t, err)
}
