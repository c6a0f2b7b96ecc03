package main

import (
	"context"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// walkCommands calls leaf for every runnable command and group for every
// group of the command table, with its path.
func walkCommands(path []string, cmds map[string]*command, leaf, group func(path []string, c *command)) {
	for _, name := range sortedKeys(cmds) {
		c := cmds[name]
		p := append(slices.Clone(path), name)
		if c.subs != nil {
			group(p, c)
			walkCommands(p, c.subs, leaf, group)
			continue
		}
		leaf(p, c)
	}
}

// exampleArgs returns the arguments of an example command line after
// "sluice", up to a shell redirection or pipe, with quotes removed.
func exampleArgs(t *testing.T, example string) []string {
	t.Helper()
	words := splitQuoted(example)
	i := slices.Index(words, "sluice")
	require.GreaterOrEqual(t, i, 0, "example %q does not run sluice", example)
	var out []string
	for _, w := range words[i+1:] {
		if w == "<" || w == ">" || w == "|" || w == "&&" {
			break
		}
		out = append(out, w)
	}
	return out
}

func splitQuoted(s string) []string {
	var out []string
	var cur strings.Builder
	quote := rune(0)
	inWord := false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

// TestEveryCommandHasHelp walks the command table itself, so a command added
// later is covered without touching this test. Every command answers -h and
// --help on stdout with exit 0: its usage line, an example and every flag it
// registers (read from the FlagSet it parsed with); a bad flag gives the
// error and the same usage on stderr with exit 2; the example's flags are
// all known. Every group lists its commands on -h (exit 0) and refuses to
// run without one (exit 2).
func TestEveryCommandHasHelp(t *testing.T) {
	t.Setenv(adminTokenEnv, "") // nothing below may reach an admin API
	leaves := 0
	walkCommands(nil, commands(), func(path []string, c *command) {
		leaves++
		name := strings.Join(path, " ")
		t.Run(name, func(t *testing.T) {
			require.NotEmpty(t, c.summary, "summary")
			require.NotNil(t, c.run, "run")
			require.True(t, strings.HasPrefix(c.example, "sluice "+name), "the example %q runs sluice %s", c.example, name)

			// The command parses its flags through parseFlags, which hands
			// back the FlagSet: the test's own list of registered flags.
			err := c.run(context.Background(), env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}, []string{"-h"})
			var help helpError
			require.ErrorAs(t, err, &help, "sluice %s -h must ask for help, got %v", name, err)
			var flags []string
			help.fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f.Name) })

			for _, h := range []string{"-h", "--help"} {
				code, out, errOut := runCLI(t, "", append(slices.Clone(path), h)...)
				assert.Equal(t, 0, code, "%s %s", name, h)
				assert.Empty(t, errOut, "%s %s writes nothing on stderr", name, h)
				assert.True(t, strings.HasPrefix(out, "usage: sluice "+name), "%s %s: %q", name, h, out)
				assert.Contains(t, out, "\nexample:\n  "+c.example+"\n")
				for _, f := range flags {
					assert.Contains(t, out, "\n  --"+f, "%s %s lists --%s", name, h, f)
				}
				if len(flags) > 0 {
					assert.Contains(t, out, "\nflags:\n")
				}
			}

			code, out, errOut := runCLI(t, "", append(slices.Clone(path), "--no-such-flag")...)
			assert.Equal(t, 2, code)
			assert.Empty(t, out)
			first, rest, _ := strings.Cut(errOut, "\n")
			assert.Equal(t, "sluice "+name+": unknown flag --no-such-flag", first)
			assert.True(t, strings.HasPrefix(rest, "usage: sluice "+name), "the usage follows the error: %q", errOut)
			for _, f := range flags {
				assert.Contains(t, rest, "\n  --"+f)
			}

			// The example's flags exist: -h after them exits 0 only when
			// every flag before it parsed.
			code, _, errOut = runCLI(t, "", append(exampleArgs(t, c.example), "-h")...)
			assert.Equal(t, 0, code, "example %q: %s", c.example, errOut)
		})
	}, func(path []string, c *command) {
		name := strings.Join(path, " ")
		t.Run(name, func(t *testing.T) {
			require.NotEmpty(t, c.summary)
			for _, h := range []string{"-h", "--help", "help"} {
				code, out, errOut := runCLI(t, "", append(slices.Clone(path), h)...)
				assert.Equal(t, 0, code)
				assert.Empty(t, errOut)
				assert.True(t, strings.HasPrefix(out, "usage: sluice "+name+" "), out)
				for _, sub := range sortedKeys(c.subs) {
					assert.Contains(t, out, "\n  "+name+" "+sub+" ", "%s %s lists %s", name, h, sub)
				}
			}
			code, out, errOut := runCLI(t, "", path...)
			assert.Equal(t, 2, code)
			assert.Empty(t, out)
			assert.True(t, strings.HasPrefix(errOut, "sluice "+name+": missing command\nusage: sluice "+name+" "), errOut)
		})
	})
	assert.GreaterOrEqual(t, leaves, 20, "the walk found the commands")

	// The top level lists every command.
	code, out, errOut := runCLI(t, "", "--help")
	assert.Equal(t, 0, code)
	assert.Empty(t, errOut)
	walkCommands(nil, commands(), func(path []string, _ *command) {
		assert.Contains(t, out, "\n  "+strings.Join(path, " ")+" ")
	}, func([]string, *command) {})
}

// TestHelpPrintedOnce: a command that sets its own Usage or output on its
// FlagSet still gets exactly one help text, the dispatcher's.
func TestHelpPrintedOnce(t *testing.T) {
	var out, errb strings.Builder
	c := &command{summary: "s", usage: "[--x N]", example: "sluice t --x 1", run: func(_ context.Context, e env, args []string) error {
		fs := flag.NewFlagSet("sluice t", flag.ContinueOnError)
		fs.SetOutput(e.stdout)
		fs.Usage = func() { _, _ = io.WriteString(e.stdout, "custom usage\n") }
		fs.Int("x", 0, "a number")
		return parseFlags(fs, args, 0)
	}}
	e := env{stdout: &out, stderr: &errb}
	err := c.run(context.Background(), e, []string{"-h"})
	var help helpError
	require.ErrorAs(t, err, &help)
	assert.Empty(t, out.String(), "the flag package printed nothing while parsing")
	printLeafHelp(&out, []string{"t"}, c, help.fs)
	assert.Equal(t, 1, strings.Count(out.String(), "usage: sluice t"), out.String())
	assert.Contains(t, out.String(), "\n  --x int\n")
}
