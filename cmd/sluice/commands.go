package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/internal/suggest"
)

// version is set at link time (-ldflags "-X main.version=..."); without
// it `sluice version` reports the module version from the build info.
var version = ""

// env carries the process's standard streams to a subcommand.
type env struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// command is one node of the command tree: a leaf has run, a group has subs.
// A leaf's run parses its flags with newFlags and parseFlags (or
// parseInterleaved); the dispatcher then prints its help by construction:
// -h/--help gives usage, summary, example and the flag package's own
// PrintDefaults on stdout (exit 0), a bad flag the error and the same usage
// on stderr (exit 2). A command added to the table is covered by
// TestEveryCommandHasHelp without further work.
type command struct {
	summary string // one line, shown in the parent's list and under usage
	usage   string // what follows "sluice <path> " on the usage line
	example string // one full command line (leaves)
	run     func(ctx context.Context, e env, args []string) error
	subs    map[string]*command
}

// commands is the command tree.
func commands() map[string]*command {
	return map[string]*command{
		"version": {summary: "print the version", usage: "",
			example: "sluice version", run: runVersion},
		"serve": {summary: "run the scheduler: the OpenAI-compatible API, the admin API and /metrics",
			usage: "--config FILE", example: "sluice serve --config /etc/sluice/sluice.yaml", run: runServe},
		"sim": {summary: "run simulated vLLM replicas (the vLLM flag names; --replicas N takes consecutive ports)",
			usage:   "[--listen ADDR] [--replicas N] [--model NAME] [flags]",
			example: "sluice sim --listen 127.0.0.1:8100 --replicas 2 --model sim-model --max-num-seqs 64 --kv-tokens 65536",
			run:     runSim},
		"bench": {summary: "load generator (vllm bench serve's flags, plus multi-tenant workloads)", subs: map[string]*command{
			"run": {summary: "one target, one workload", usage: "--base-url URL [flags]",
				example: "sluice bench run --base-url http://127.0.0.1:8080 --num-prompts 200 --request-rate 10 --save-result --result-dir out",
				run:     runBenchRun},
			"ab": {summary: "one schedule twice: A = the replicas directly, B = through Sluice",
				usage:   "--a URL[,URL...] --b URL [flags]",
				example: "sluice bench ab --a http://127.0.0.1:8100,http://127.0.0.1:8101 --b http://127.0.0.1:8080 --workload overhead --capacity 8",
				run:     runBenchAB},
			"compare": {summary: "B/A ratios from two saved results", usage: "A.json B.json",
				example: "sluice bench compare direct.json sluice.json", run: runBenchCompare},
			"sweep": {summary: "one run per total request rate; reports the knee", usage: "--rates R,R,... [flags]",
				example: "sluice bench sweep --base-url http://127.0.0.1:8080 --rates 2,4,8,16 --duration 60s",
				run:     runBenchSweep},
		}},
		"demo": {summary: "the same flood against simulated replicas directly and through Sluice, contrasted in one table",
			usage: "[--duration DUR] [--html FILE] [--verbose] [--keep]", example: "sluice demo --duration 10s --keep", run: runDemo},
		"config": {summary: "config files", subs: map[string]*command{
			"check": {summary: "validate a config file: every problem with its field path (exit 0 or 2)", usage: "FILE",
				example: "sluice config check sluice.yaml", run: runConfigCheck},
		}},
		"key": {summary: "API keys", subs: map[string]*command{
			"hash": {summary: "read an API key on stdin, print the sha256:<hex> form the config stores", usage: "< KEYFILE",
				example: "sluice key hash < key.txt", run: runKeyHash},
			"create": {summary: "admin: create a run-time key (shown once; only its hash is stored)",
				usage:   "--tenant NAME [--name N] [--expires-in DUR] [--budget DIM:LIMIT/WINDOW[:warn]]... [--concurrency N]",
				example: "sluice key create --tenant acme --name ci-bot --expires-in 720h --budget tokens:100000/24h --concurrency 4",
				run:     runKeyCreate},
			"list": {summary: "admin: list keys (no secrets)", usage: "[--tenant NAME]",
				example: "sluice key list --tenant acme", run: runKeyList},
			"revoke": {summary: "admin: revoke a key; admitted requests finish", usage: "ID",
				example: "sluice key revoke key_3f9a0c12be44", run: runKeyRevoke},
		}},
		"gpus": {summary: "one NVML sample of the node's GPUs and their health; --watch polls and reports deltas", usage: "[--json] [--watch DUR [--interval DUR]]",
			example: "sluice gpus --json", run: runGPUs},
		"budget": {summary: "admin: a running server's budgets", subs: map[string]*command{
			"set": {summary: "set one budget: an override on top of the config's budget with the same dimension and window",
				usage:   "--tenant T --dimension D --limit N --window DUR [--mode block|warn]",
				example: "sluice budget set --tenant acme --dimension tokens --limit 500000 --window 1h", run: runBudgetSet},
			"list": {summary: "list budgets", usage: "[--tenant T]", example: "sluice budget list --tenant acme", run: runBudgetList},
			"rm": {summary: "remove a budget override: the config's budget with that id (if any) applies again; ID's window in any duration spelling", usage: "ID",
				example: "sluice budget rm acme:tokens:24h", run: runBudgetRm},
		}},
		"usage": {summary: "admin: a running server's cumulative usage per tenant, key and model (chargeback)",
			usage:   "[--tenant T] [--key NAME] [--model M] [--dimension D] [--window DUR] [--csv]",
			example: "sluice usage --window 720h --csv > november.csv", run: runUsage},
		"reservations": {summary: "admin: a running server's ledger reservations", subs: map[string]*command{
			"list": {summary: "list open reservations", usage: "[--state S] [--tenant T]",
				example: "sluice reservations list --state unresolved", run: runReservationsList},
			"resolve": {summary: "charge one unresolved reservation and close it",
				usage:   "ID --tenant T --charge held|actual|zero [--actual dim=N,...] --reason TEXT",
				example: `sluice reservations resolve 0f3a9c --tenant acme --charge held --reason "replica lost"`,
				run:     runReservationsResolve},
		}},
		"tenant": {summary: "admin: clamp a tenant of a running server", subs: map[string]*command{
			"clamp": {summary: "restrict a tenant for a while",
				usage:   "NAME [--concurrency N] [--weight N] [--max-output-tokens N] [--models a,b] --reason TEXT --for DUR",
				example: `sluice tenant clamp acme --concurrency 1 --max-output-tokens 256 --reason "runaway agent" --for 30m`,
				run:     runTenantClamp},
			"unclamp": {summary: "lift a tenant's clamp", usage: "NAME", example: "sluice tenant unclamp acme", run: runTenantUnclamp},
		}},
		"drain": {summary: "admin: stop admitting, finish what runs, exit", usage: "[--admin URL]",
			example: "sluice drain --admin http://127.0.0.1:8081", run: runDrain},
		"reload": {summary: "admin: re-read the server's config file", usage: "[--admin URL]",
			example: "sluice reload", run: runReload},
		"tune": {summary: "recommend each tenant's queue.max_depth, queue.max_wait (and concurrency) from saved bench results or a running server's /metrics (Little's law)",
			usage:   "[--slo-ttft 2s] [--limit] [--config FILE [--out FILE]] (RESULT.json... | --metrics URL [--window 30s])",
			example: "sluice tune --slo-ttft 2s --config sluice.yaml --out tuned.yaml sweep.json", run: runTune},
		"audit": {summary: "audit logs", subs: map[string]*command{
			"verify": {summary: "check that audit files form one unbroken hash chain", usage: "[--partial] FILE...",
				example: "sluice audit verify /var/lib/sluice/audit.log", run: runAudit},
		}},
	}
}

// usageError marks an error as the user's: bad flags, bad input, bad config.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// usagef builds a usageError; the caller's message is printed as one line.
func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// flagError is a usageError from parsing a command line: the dispatcher
// prints the command's usage after it.
type flagError struct {
	usageError
	fs *flag.FlagSet
}

func (f flagError) Unwrap() error { return f.usageError }

// helpError answers -h/--help; it carries the command's FlagSet so the
// dispatcher can print its flags.
type helpError struct{ fs *flag.FlagSet }

func (helpError) Error() string     { return flag.ErrHelp.Error() }
func (helpError) Unwrap() error     { return flag.ErrHelp }
func isHelpArg(a string) bool       { return a == "-h" || a == "-help" || a == "--help" }
func isHelpWord(a string) bool      { return isHelpArg(a) || a == "help" }
func oneLine(s string) string       { return strings.ReplaceAll(strings.TrimSpace(s), "\n", "; ") }
func joinPath(path []string) string { return strings.Join(path, " ") }

// beforeDashDash returns args up to a "--", after which all are positional.
func beforeDashDash(args []string) []string {
	if i := slices.Index(args, "--"); i >= 0 {
		return args[:i]
	}
	return args
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// run dispatches to a subcommand and maps its error to an exit code:
// 0 success (and help), 1 failure, 2 usage.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := env{stdin: stdin, stdout: stdout, stderr: stderr}
	root := &command{summary: "the Sluice scheduler, its vLLM simulator, its load generator and the admin clients",
		usage: "<command> [flags]", subs: commands()}
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		args = append([]string{"version"}, args[1:]...)
	}
	if len(args) > 0 && args[0] == "help" {
		// `sluice help budget set` is `sluice budget set -h`.
		args = append(slices.Clone(args[1:]), "-h")
	}
	var path []string
	c := root
	for c.subs != nil {
		switch {
		case len(args) == 0:
			if len(path) > 0 {
				fmt.Fprintf(stderr, "sluice %s: missing command\n", joinPath(path))
			}
			printGroupHelp(stderr, path, c)
			return 2
		case isHelpWord(args[0]):
			printGroupHelp(stdout, path, c)
			return 0
		}
		sub, ok := c.subs[args[0]]
		if !ok {
			if strings.HasPrefix(args[0], "-") {
				// A flag where a command belongs: say so, not "unknown command".
				fmt.Fprintf(stderr, "%s: %s is a flag; name a command first (%s)\n", cmdLine(path, ""), dashed(args[0]), strings.Join(sortedKeys(c.subs), ", "))
				printGroupHelp(stderr, path, c)
				return 2
			}
			fmt.Fprintf(stderr, "sluice: unknown command %q\n", joinPath(append(path, args[0])))
			if s := suggest.Closest(args[0], sortedKeys(c.subs)); s != "" {
				fmt.Fprintf(stderr, "Did you mean %q?\n", joinPath(append(slices.Clone(path), s)))
			}
			if len(path) == 0 {
				fmt.Fprintln(stderr, "Run 'sluice help' for the list of commands.")
			} else {
				printGroupHelp(stderr, path, c)
			}
			return 2
		}
		path = append(path, args[0])
		c, args = sub, args[1:]
	}
	err := c.run(ctx, e, args)
	var (
		help helpError
		fe   flagError
		ue   usageError
	)
	switch {
	case err == nil:
		return 0
	case errors.As(err, &help):
		printLeafHelp(stdout, path, c, help.fs)
		return 0
	case errors.Is(err, flag.ErrHelp):
		printLeafHelp(stdout, path, c, nil)
		return 0
	case errors.As(err, &fe):
		fmt.Fprintf(stderr, "sluice %s: %s\n", joinPath(path), oneLine(err.Error()))
		printLeafHelp(stderr, path, c, fe.fs)
		return 2
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "sluice %s: %s\n", joinPath(path), oneLine(err.Error()))
		return 2
	}
	fmt.Fprintf(stderr, "sluice %s: %v\n", joinPath(path), err)
	return 1
}

// printLeafHelp prints a command's usage line, summary, example and flags
// (the flag package's PrintDefaults, with each default).
func printLeafHelp(w io.Writer, path []string, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n", cmdLine(path, c.usage), c.summary)
	if c.example != "" {
		fmt.Fprintf(w, "\nexample:\n  %s\n", c.example)
	}
	if fs == nil {
		return
	}
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	printFlags(w, fs)
}

// printFlags lists a FlagSet's flags as the flag package's PrintDefaults
// does, but spelled --name, as the usage lines and examples spell them.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		var b strings.Builder
		fmt.Fprintf(&b, "  --%s", f.Name)
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			b.WriteString(" " + name)
		}
		b.WriteString("\n    \t")
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		if !zeroDefault(f) {
			if g, ok := f.Value.(flag.Getter); ok && isString(g.Get()) {
				fmt.Fprintf(&b, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(&b, " (default %v)", f.DefValue)
			}
		}
		fmt.Fprintln(w, b.String())
	})
}

func isString(v any) bool { _, ok := v.(string); return ok }

// zeroDefault reports whether a flag's default is its type's zero value,
// which PrintDefaults leaves unsaid too.
func zeroDefault(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "0", "0s", "false", "[]", "<nil>":
		return true
	}
	return false
}

// dashed spells a flag argument ("-x", "--x=1") as --x.
func dashed(arg string) string {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	return "--" + name
}

// flagMessage rewrites the flag package's error text in the --name
// spelling and adds a "did you mean" for an unknown flag.
func flagMessage(err error, fs *flag.FlagSet) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		msg = "unknown flag --" + name
		if s := suggest.Closest(name, names); s != "" {
			msg += " (did you mean --" + s + "?)"
		}
		return errors.New(msg)
	}
	for _, p := range []string{"flag needs an argument: -", " for flag -", " for -", "bad flag syntax: -"} {
		msg = strings.Replace(msg, p, p+"-", 1)
	}
	return errors.New(msg)
}

// printGroupHelp lists a group's commands, down to the leaves.
func printGroupHelp(w io.Writer, path []string, c *command) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n\ncommands:\n", cmdLine(path, groupUsage(c)), c.summary)
	var rows [][2]string
	var walk func(prefix []string, c *command)
	walk = func(prefix []string, c *command) {
		for _, name := range sortedKeys(c.subs) {
			sub := c.subs[name]
			p := append(slices.Clone(prefix), name)
			if sub.subs == nil {
				rows = append(rows, [2]string{joinPath(p), sub.summary})
				continue
			}
			walk(p, sub)
		}
	}
	walk(path, c)
	width := 0
	for _, r := range rows {
		width = max(width, len(r[0]))
	}
	for _, r := range rows {
		fmt.Fprintf(w, "  %-*s  %s\n", width, r[0], r[1])
	}
	fmt.Fprintf(w, "\nRun '%s <command> -h' for a command's flags and an example.\n", cmdLine(path, ""))
}

// cmdLine is "sluice <path> <rest>" without doubled blanks.
func cmdLine(path []string, rest string) string {
	return strings.Join(slices.DeleteFunc(append(append([]string{"sluice"}, path...), rest), func(s string) bool { return s == "" }), " ")
}

func groupUsage(c *command) string {
	if c.usage != "" {
		return c.usage
	}
	return strings.Join(sortedKeys(c.subs), "|") + " [flags]"
}

// newFlags returns the FlagSet of command name ("budget set"). It reports
// errors instead of exiting and prints nothing itself: parseFlags returns
// what went wrong with the FlagSet, and the dispatcher prints the usage on
// stdout (-h) or stderr (a bad flag).
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parseFlags parses args and refuses stray positional arguments beyond maxPos
// (maxPos < 0: any number). -h or --help anywhere before a "--" asks for
// help, also after positional arguments. The flag package prints nothing
// here, whatever Usage or output a caller set: the dispatcher is the one
// place that prints help and errors.
func parseFlags(fs *flag.FlagSet, args []string, maxPos int) error {
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return helpError{fs}
		}
		return flagError{usageError{flagMessage(err, fs)}, fs}
	}
	rest := fs.Args()
	if used := len(args) - len(rest); used == 0 || args[used-1] != "--" {
		if slices.ContainsFunc(beforeDashDash(rest), isHelpArg) {
			return helpError{fs}
		}
	}
	if maxPos >= 0 && len(rest) > maxPos {
		return flagError{usageError{fmt.Errorf("unexpected argument %q", rest[maxPos])}, fs}
	}
	return nil
}

func runVersion(_ context.Context, e env, args []string) error {
	if err := parseFlags(newFlags("version"), args, 0); err != nil {
		return err
	}
	bi, _ := debug.ReadBuildInfo()
	fmt.Fprint(e.stdout, versionText(version, bi))
	return nil
}

// versionText is what `sluice version` prints: the module version (a
// link-time -X main.version wins over the module's), the VCS revision the
// binary was built from (and whether the tree had uncommitted changes) and
// the Go toolchain. go build records the revision when it runs inside a
// git checkout; `go run` and test binaries do not.
func versionText(linked string, bi *debug.BuildInfo) string {
	v, rev, at, dirty, goVer := linked, "unknown", "", false, runtime.Version()
	if bi != nil {
		if (v == "" || v == "dev") && bi.Main.Version != "" {
			v = bi.Main.Version
		}
		goVer = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sluice %s\n", v)
	fmt.Fprintf(&b, "revision: %s", rev)
	if at != "" {
		fmt.Fprintf(&b, " (%s)", at)
	}
	if dirty {
		b.WriteString(" with uncommitted changes")
	}
	fmt.Fprintf(&b, "\ngo: %s\n", goVer)
	return b.String()
}
