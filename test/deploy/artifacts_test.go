package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
)

// dockerStage is one FROM … stage of a Dockerfile.
type dockerStage struct {
	name, image string
	// instr holds the stage's instructions: keyword (upper case) and rest.
	instr [][2]string
}

type dockerfile struct{ stages []dockerStage }

func parseDockerfile(file string) (*dockerfile, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	df := &dockerfile{}
	for _, line := range logicalLines(b) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		kw, rest, _ := strings.Cut(line, " ")
		kw = strings.ToUpper(kw)
		rest = strings.TrimSpace(rest)
		if kw == "FROM" {
			w := strings.Fields(rest)
			st := dockerStage{image: w[0]}
			if len(w) == 3 && strings.EqualFold(w[1], "AS") {
				st.name = w[2]
			}
			df.stages = append(df.stages, st)
			continue
		}
		if len(df.stages) == 0 {
			continue // global ARGs
		}
		s := &df.stages[len(df.stages)-1]
		s.instr = append(s.instr, [2]string{kw, rest})
	}
	if len(df.stages) == 0 {
		return nil, fmt.Errorf("%s has no FROM", file)
	}
	return df, nil
}

func (df *dockerfile) stage(name string) *dockerStage {
	for i := range df.stages {
		if df.stages[i].name == name {
			return &df.stages[i]
		}
	}
	return nil
}

func (s *dockerStage) all(kw string) []string {
	var out []string
	for _, in := range s.instr {
		if in[0] == kw {
			out = append(out, in[1])
		}
	}
	return out
}

// goBuildLine returns the build stage's `go build` RUN command, without RUN
// options such as --mount, and the path it writes (-o).
func (df *dockerfile) goBuildLine() (cmd, out string, err error) {
	b := df.stage("build")
	if b == nil {
		return "", "", fmt.Errorf("no stage named build")
	}
	for _, run := range b.all("RUN") {
		if !strings.Contains(run, "go build") {
			continue
		}
		w := strings.Fields(run)
		for len(w) > 0 && strings.HasPrefix(w[0], "--") {
			w = w[1:]
		}
		cmd = strings.Join(w, " ")
		words := splitWords(cmd)
		for i, x := range words {
			if x == "-o" && i+1 < len(words) {
				out = words[i+1]
			}
		}
		if out == "" {
			return "", "", fmt.Errorf("go build in the build stage has no -o")
		}
		return cmd, out, nil
	}
	return "", "", fmt.Errorf("build stage has no RUN … go build")
}

// execForm decodes an exec-form (JSON array) instruction.
func execForm(t *testing.T, s string) []string {
	t.Helper()
	require.True(t, strings.HasPrefix(s, "["), "want exec form [\"…\"], got %s", s)
	var out []string
	for _, m := range regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`).FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

func TestDockerfile(t *testing.T) {
	df, err := parseDockerfile(deployPath(t, "Dockerfile"))
	require.NoError(t, err)
	bin := sluiceBin(t) // dry-runs the build stage's go build line, builds with its -ldflags

	t.Run("multi-stage with a go build stage", func(t *testing.T) {
		require.GreaterOrEqual(t, len(df.stages), 2)
		assert.Contains(t, df.stages[0].image, "golang:")
		cmd, _, err := df.goBuildLine()
		require.NoError(t, err)
		assert.Contains(t, cmd, "./cmd/sluice")
		assert.Contains(t, cmd, "-trimpath")
	})
	t.Run("go version matches go.mod", func(t *testing.T) {
		m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(readFile(t, filepath.Join(repoRoot(t), "go.mod")))
		require.NotNil(t, m)
		m2 := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)`).FindSubmatch(readFile(t, deployPath(t, "Dockerfile")))
		require.NotNil(t, m2, "Dockerfile pins ARG GO_VERSION")
		assert.Equal(t, string(m[1]), string(m2[1]))
	})
	t.Run("ldflags version variable exists", func(t *testing.T) {
		code, out, errOut := runBin(t, bin, "version")
		require.Equal(t, 0, code, errOut)
		first, _, _ := strings.Cut(out, "\n")
		assert.Equal(t, "sluice "+builtVersion, first, "-X main.version must name the binary's version variable")
		assert.Contains(t, out, "\ngo: go1.", "the Go version follows (revision and go lines)")
	})
	final := df.stages[len(df.stages)-1]
	t.Run("final stage is small and non-root", func(t *testing.T) {
		assert.Contains(t, final.image, "distroless", "runtime image")
		assert.Empty(t, final.all("RUN"), "the runtime stage runs nothing (distroless has no shell)")
		users := final.all("USER")
		require.NotEmpty(t, users)
		u, _, _ := strings.Cut(users[len(users)-1], ":")
		assert.NotContains(t, []string{"0", "root", ""}, u)
		_, out, err := df.goBuildLine()
		require.NoError(t, err)
		// Two COPYs: the binary, and the empty data directory owned by the
		// runtime user (a volume mounted there starts with its owner).
		copies := final.all("COPY")
		require.Len(t, copies, 2)
		w := strings.Fields(copies[0])
		require.Len(t, w, 3, "COPY --from=build SRC DST")
		d := strings.Fields(copies[1])
		require.Len(t, d, 4, "COPY --from=build --chown=USER SRC DST")
		assert.Equal(t, "--chown="+users[len(users)-1], d[1], "the data directory belongs to the runtime user")
		assert.Equal(t, config.DefaultDataDir, d[3])
		assert.Equal(t, []string{`["` + config.DefaultDataDir + `"]`}, final.all("VOLUME"), "the data directory is a volume")
		assert.Equal(t, "--from=build", w[0])
		assert.Equal(t, out, w[1], "COPY takes what go build wrote")
		ep := execForm(t, final.all("ENTRYPOINT")[0])
		assert.Equal(t, []string{w[2]}, ep, "ENTRYPOINT runs the copied binary")
	})
	t.Run("CMD flags exist", func(t *testing.T) {
		cmd := execForm(t, final.all("CMD")[0])
		require.Equal(t, "serve", cmd[0])
		checkSluiceFlags(t, bin, cmd)
	})
	t.Run("EXPOSE matches the ports the manifests use", func(t *testing.T) {
		assert.Equal(t, []string{"8080 8081"}, final.all("EXPOSE"))
	})
	t.Run("dockerignore keeps .git out", func(t *testing.T) {
		assert.Contains(t, strings.Fields(string(readFile(t, deployPath(t, "Dockerfile.dockerignore")))), ".git")
	})
}

// unit is a parsed systemd unit: section → key → values in order.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, b []byte) unit {
	t.Helper()
	u := unit{}
	sec := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			sec = line[1 : len(line)-1]
			u[sec] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "unit line %q", line)
			require.NotEmpty(t, sec, "key outside a section: %q", line)
			u[sec][k] = append(u[sec][k], v)
		}
	}
	return u
}

func (u unit) one(t *testing.T, sec, key string) string {
	t.Helper()
	v := u[sec][key]
	require.Len(t, v, 1, "[%s] %s set once", sec, key)
	return v[0]
}

// under reports whether p is dir or below it.
func under(p, dir string) bool {
	p, dir = path.Clean(p), path.Clean(dir)
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func TestSystemdUnit(t *testing.T) {
	bin := sluiceBin(t)
	u := parseUnit(t, readFile(t, deployPath(t, "systemd", "sluice.service")))
	svc := u["Service"]
	require.NotNil(t, svc)

	exec := splitWords(u.one(t, "Service", "ExecStart"))
	require.GreaterOrEqual(t, len(exec), 2)
	assert.True(t, path.IsAbs(exec[0]) && path.Base(exec[0]) == "sluice", "ExecStart runs an absolute sluice: %v", exec)
	require.Equal(t, "serve", exec[1])
	var cfgPath string
	for i, w := range exec {
		if w == "--config" && i+1 < len(exec) {
			cfgPath = exec[i+1]
		} else if v, ok := strings.CutPrefix(w, "--config="); ok {
			cfgPath = v
		}
	}
	require.NotEmpty(t, cfgPath, "ExecStart passes --config")
	// The unit's config is deploy/systemd/<basename>.
	local := deployPath(t, "systemd", path.Base(cfgPath))

	t.Run("ExecStart flags exist", func(t *testing.T) { checkSluiceFlags(t, bin, exec[1:]) })
	t.Run("ExecStartPre checks the same config", func(t *testing.T) {
		pre := splitWords(u.one(t, "Service", "ExecStartPre"))
		require.Equal(t, []string{exec[0], "config", "check", cfgPath}, pre)
		code, out, errOut := runBin(t, bin, "config", "check", local)
		assert.Equal(t, 0, code, "sluice config check %s: %s", local, errOut)
		assert.Contains(t, out, "ok")
	})
	cfg, err := config.Load(local)
	require.NoError(t, err)

	t.Run("dedicated user", func(t *testing.T) {
		user := u.one(t, "Service", "User")
		assert.NotContains(t, []string{"", "root", "0"}, user)
		assert.NotContains(t, svc, "DynamicUser", "a dedicated user owns the journal across restarts")
		sysusers := string(readFile(t, deployPath(t, "systemd", "sluice.sysusers.conf")))
		assert.Regexp(t, `(?m)^u `+regexp.QuoteMeta(user)+` `, sysusers, "sysusers.d creates the user")
	})
	t.Run("hardening", func(t *testing.T) {
		for _, kv := range [][2]string{
			{"NoNewPrivileges", "yes"}, {"ProtectSystem", "strict"}, {"ProtectHome", "yes"},
			{"PrivateTmp", "yes"}, {"CapabilityBoundingSet", ""}, {"AmbientCapabilities", ""},
			{"RestrictSUIDSGID", "yes"}, {"ProtectKernelModules", "yes"}, {"MemoryDenyWriteExecute", "yes"},
		} {
			assert.Equal(t, kv[1], u.one(t, "Service", kv[0]), kv[0])
		}
	})
	t.Run("only the state directory is writable", func(t *testing.T) {
		rw := strings.Fields(strings.Join(svc["ReadWritePaths"], " "))
		require.NotEmpty(t, rw)
		for _, sd := range svc["StateDirectory"] {
			for _, d := range strings.Fields(sd) {
				assert.Contains(t, rw, "/var/lib/"+d, "StateDirectory %s is the writable path", d)
			}
		}
		writes := map[string]string{"audit.path": cfg.Audit.Path}
		for _, d := range cfg.Durability() {
			require.NotEmpty(t, d.Path, "%s is kept in memory only: the node config keeps it in data_dir", d.What)
			writes[d.What] = filepath.Join(d.Path, "x") // a directory (shared_state) or a file: its parent must be writable
			if d.What != "shared_state" {
				writes[d.What] = d.Path
			}
		}
		assert.Equal(t, config.DefaultDataDir, cfg.Paths().Dir, "data_dir is the unit's state directory")
		for field, p := range writes {
			if p == "" {
				continue
			}
			ok := false
			for _, d := range rw {
				ok = ok || under(path.Dir(p), d)
			}
			assert.True(t, ok, "%s %s is outside ReadWritePaths %v", field, p, rw)
		}
		for _, d := range rw {
			assert.True(t, under(d, "/var/lib/sluice"), "writable path %s beyond the journal's directory", d)
		}
	})
	t.Run("stop waits for the drain", func(t *testing.T) {
		assert.Equal(t, "SIGTERM", u.one(t, "Service", "KillSignal"))
		stop, err := time.ParseDuration(u.one(t, "Service", "TimeoutStopSec"))
		require.NoError(t, err)
		assert.Greater(t, stop, cfg.Server.DrainTimeout, "TimeoutStopSec must outlast server.drain_timeout")
	})
}
