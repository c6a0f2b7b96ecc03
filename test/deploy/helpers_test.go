package deploy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// repoRoot is the module root (two levels above this package).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// deployPath joins parts under deploy/.
func deployPath(t testing.TB, parts ...string) string {
	return filepath.Join(append([]string{repoRoot(t), "deploy"}, parts...)...)
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// builtVersion is the version the tests inject through the Dockerfile's
// -X main.version=${VERSION}.
const builtVersion = "deploy-test"

var (
	buildOnce sync.Once
	buildBin  string
	buildCmd  string
	errBuild  error
	buildOut  []byte
)

// sluiceBin builds cmd/sluice once per test binary and returns its path.
//
// The Dockerfile's build-stage `go build` line is first run as is with -n
// (every flag parsed, nothing compiled), then the test binary is built with
// that line's -ldflags only: -trimpath and a forced CGO_ENABLED would compile
// every package a second time under other cache keys, which costs minutes on
// a small machine and checks nothing more. TestDockerfile checks that the
// -X main.version variable exists through `sluice version`.
func sluiceBin(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() { buildBin, buildCmd, buildOut, errBuild = build(repoRoot(t)) })
	require.NoError(t, errBuild, "%s:\n%s", buildCmd, buildOut)
	return buildBin
}

func build(root string) (bin, cmd string, out []byte, err error) {
	df, err := parseDockerfile(filepath.Join(root, "deploy", "Dockerfile"))
	if err != nil {
		return "", "", nil, err
	}
	line, _, err := df.goBuildLine()
	if err != nil {
		return "", "", nil, err
	}
	env := append(os.Environ(), "VERSION="+builtVersion)
	if _, err := exec.LookPath("gcc"); err != nil {
		// Without a C compiler CGO_ENABLED=1 cannot even plan the build.
		line = strings.ReplaceAll(line, "CGO_ENABLED=1", "CGO_ENABLED=0")
	}
	dry := strings.Replace(line, "go build ", "go build -n ", 1)
	c := exec.Command("sh", "-c", dry)
	c.Dir = root
	c.Env = env
	if out, err := c.CombinedOutput(); err != nil {
		return "", dry, out, fmt.Errorf("the Dockerfile's build command: %w", err)
	}
	words := splitWords(line)
	ldflags := ""
	for i, w := range words {
		if w == "-ldflags" && i+1 < len(words) {
			ldflags = strings.ReplaceAll(words[i+1], "${VERSION}", builtVersion)
		}
	}
	dir, err := os.MkdirTemp("", "sluice-deploy-test-")
	if err != nil {
		return "", "", nil, err
	}
	bin = filepath.Join(dir, "sluice")
	args := []string{"build", "-ldflags", ldflags, "-o", bin, "./cmd/sluice"}
	c = exec.Command("go", args...)
	c.Dir = root
	c.Env = env
	out, err = c.CombinedOutput()
	return bin, "go " + strings.Join(args, " "), out, err
}

// runBin runs the binary to completion with a timeout.
func runBin(t testing.TB, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	c := exec.CommandContext(ctx, bin, args...)
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		require.NoError(t, err)
	}
	return code, out.String(), errb.String()
}

// checkSluiceFlags asserts that every flag in args (a sluice command line
// without the binary: "serve --config FILE") exists. It asks the binary:
// Go's flag package stops at the first unknown flag with exit 2, and reaches
// a trailing -h (exit 0) only when every flag before it was known.
func checkSluiceFlags(t *testing.T, bin string, args []string) {
	t.Helper()
	require.NotEmpty(t, args)
	sub := args[0]
	code, _, stderr := runBin(t, bin, append(append([]string{}, args...), "-h")...)
	require.Equal(t, 0, code, "sluice %s rejects its flags %v: %s", sub, args[1:], stderr)
	// The check can fail: an unknown flag must be refused.
	code, _, stderr = runBin(t, bin, sub, "--no-such-flag-deploy-test", "-h")
	require.Equal(t, 2, code, "sluice %s accepted an unknown flag: %s", sub, stderr)
}

var shellWord = regexp.MustCompile(`"[^"]*"|'[^']*'|\S+`)

// splitWords splits a command line on blanks, keeping quoted strings (quotes
// removed). Enough for the command lines under deploy/.
func splitWords(s string) []string {
	var out []string
	for _, w := range shellWord.FindAllString(s, -1) {
		if len(w) >= 2 && (w[0] == '"' || w[0] == '\'') && w[len(w)-1] == w[0] {
			w = w[1 : len(w)-1]
		}
		out = append(out, w)
	}
	return out
}

// logicalLines joins backslash-continued lines.
func logicalLines(b []byte) []string {
	var out []string
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimRight(line, " \t")
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(line)
		out = append(out, cur.String())
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}
