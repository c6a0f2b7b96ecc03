package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readmeConfig returns the yaml block under the README's "A minimal
// config" heading.
func readmeConfig(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, sec, ok := strings.Cut(string(b), "\n## A minimal config\n")
	require.True(t, ok, "README.md has no \"## A minimal config\" section")
	sec, _, _ = strings.Cut(sec, "\n## ")
	m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindStringSubmatch(sec)
	require.NotNil(t, m, "the README's minimal config section has no yaml block")
	return []byte(m[1])
}

// TestReadmeConfig: the config a newcomer copies from the README loads
// with the loader `sluice config check` uses, and still shows what it
// promises: one model on two replicas, three teams, each with a daily
// token budget, a concurrency cap and a queue deadline.
func TestReadmeConfig(t *testing.T) {
	f, err := Parse(readmeConfig(t))
	require.NoError(t, err, "README.md's minimal config must pass config check")
	assert.Len(t, f.Upstream.Replicas, 2)
	require.Len(t, f.Tenants, 3)
	for _, tn := range f.Tenants {
		daily := false
		for _, b := range tn.Budgets {
			daily = daily || (b.Dimension == "tokens" && b.Window == 24*time.Hour && b.Mode == "block")
		}
		assert.True(t, daily, "tenant %s has a daily token budget", tn.Name)
		assert.Positive(t, tn.Concurrency, "tenant %s sets concurrency", tn.Name)
		assert.Positive(t, tn.Queue.MaxWait, "tenant %s sets a deadline", tn.Name)
	}
	assert.Empty(t, f.Warnings(), "no warnings (e.g. two replica URLs naming one server)")
}

// yamlKeys lists the yaml path of every key of File, as
// docs/configuration.md writes it: "ledger.redis.addrs",
// "tenants[].queue.max_wait".
func yamlKeys(prefix string, t reflect.Type, out *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" || !f.IsExported() {
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Time]():
			yamlKeys(prefix+tag+".", ft, out)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			yamlKeys(prefix+tag+"[].", ft.Elem(), out)
		default:
			*out = append(*out, prefix+tag)
		}
	}
}

// TestConfigurationDocCoversEveryKey: every key the loader accepts is
// documented in docs/configuration.md (as `path` in its reference
// tables), so a new key cannot ship undocumented; and the page names no
// key the loader would refuse.
func TestConfigurationDocCoversEveryKey(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	require.NoError(t, err)
	doc := string(b)
	var keys []string
	yamlKeys("", reflect.TypeFor[File](), &keys)
	require.Greater(t, len(keys), 100, "the walk found the schema")
	known := map[string]bool{}
	for _, k := range keys {
		known[k] = true
		assert.True(t, strings.Contains(doc, "| `"+k+"` |"), "docs/configuration.md has no row for %s", k) //nolint:testifylint // Contains would dump the page on failure
	}
	rows := regexp.MustCompile("(?m)^\\| `([a-z_.\\[\\]]+)` \\|").FindAllStringSubmatch(doc, -1)
	for _, r := range rows {
		assert.True(t, known[r[1]], "docs/configuration.md documents %s, which the config does not have", r[1])
	}
}
