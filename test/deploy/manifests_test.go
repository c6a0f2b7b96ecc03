package deploy

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
)

// The subset of Kubernetes' types the checks read.

type workload struct {
	Kind     string `yaml:"kind"`
	Metadata meta   `yaml:"metadata"`
	Spec     struct {
		Replicas    *int   `yaml:"replicas"`
		ServiceName string `yaml:"serviceName"`
		Selector    struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata meta    `yaml:"metadata"`
			Spec     podSpec `yaml:"spec"`
		} `yaml:"template"`
		VolumeClaimTemplates []struct {
			Metadata meta `yaml:"metadata"`
		} `yaml:"volumeClaimTemplates"`
	} `yaml:"spec"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
	RuntimeClassName              string         `yaml:"runtimeClassName"`
	SecurityContext               *secCtx        `yaml:"securityContext"`
	Affinity                      map[string]any `yaml:"affinity"`
	InitContainers                []container    `yaml:"initContainers"`
	Containers                    []container    `yaml:"containers"`
	Volumes                       []volume       `yaml:"volumes"`
}

type secCtx struct {
	RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
	RunAsUser                *int  `yaml:"runAsUser"`
	AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
	Capabilities             *struct {
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef    *keyRef `yaml:"secretKeyRef"`
			ConfigMapKeyRef *keyRef `yaml:"configMapKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	StartupProbe   *probe `yaml:"startupProbe"`
	Lifecycle      *struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *secCtx `yaml:"securityContext"`
	VolumeMounts    []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type keyRef struct {
	Name string `yaml:"name"`
	Key  string `yaml:"key"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	TCPSocket *struct {
		Port string `yaml:"port"`
	} `yaml:"tcpSocket"`
}

type volume struct {
	Name      string `yaml:"name"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
	Secret *struct {
		SecretName string `yaml:"secretName"`
	} `yaml:"secret"`
	EmptyDir              *struct{} `yaml:"emptyDir"`
	PersistentVolumeClaim *struct {
		ClaimName string `yaml:"claimName"`
	} `yaml:"persistentVolumeClaim"`
}

type service struct {
	Metadata meta `yaml:"metadata"`
	Spec     struct {
		ClusterIP string            `yaml:"clusterIP"`
		Selector  map[string]string `yaml:"selector"`
		Ports     []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

func workloads(t *testing.T, l *layout) []workload {
	t.Helper()
	var out []workload
	for _, d := range l.docs {
		if d.Kind == "Deployment" || d.Kind == "StatefulSet" || d.Kind == "DaemonSet" {
			var w workload
			require.NoError(t, d.node.Decode(&w), "%s %s", d.Kind, d.Metadata.Name)
			out = append(out, w)
		}
	}
	return out
}

func services(t *testing.T, l *layout) []service {
	t.Helper()
	var out []service
	for _, d := range l.byKind("Service") {
		var s service
		require.NoError(t, d.node.Decode(&s))
		out = append(out, s)
	}
	return out
}

// selects reports whether selector (non-empty) matches labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func isSluice(c container) bool { return len(c.Args) > 0 && c.Args[0] == "serve" }
func isVLLM(c container) bool   { return strings.Contains(c.Image, "vllm-openai") }

// argValue finds --name=value or --name value in args.
func argValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
		if a == name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// portOf resolves a probe or Service port (number or container port name).
func portOf(c container, p string) (int, bool) {
	if n, err := strconv.Atoi(p); err == nil {
		return n, true
	}
	for _, cp := range c.Ports {
		if cp.Name == p {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

func listenPort(t *testing.T, addr string) (host string, port int) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	require.NoError(t, err, addr)
	port, err = strconv.Atoi(p)
	require.NoError(t, err, addr)
	return h, port
}

func (ps podSpec) volume(name string) *volume {
	for i := range ps.Volumes {
		if ps.Volumes[i].Name == name {
			return &ps.Volumes[i]
		}
	}
	return nil
}

// mountFor returns the mount of c holding p (the deepest), and p relative to it.
func mountFor(c container, p string) (name, rel string, readOnly, ok bool) {
	best := -1
	for _, m := range c.VolumeMounts {
		if under(p, m.MountPath) && len(m.MountPath) > best {
			best = len(m.MountPath)
			name, readOnly, ok = m.Name, m.ReadOnly, true
			rel = strings.TrimPrefix(strings.TrimPrefix(path.Clean(p), path.Clean(m.MountPath)), "/")
		}
	}
	return name, rel, readOnly, ok
}

var catInto = regexp.MustCompile(`^cat ((?:\S+ )+)> (\S+)$`)

// fileIn returns the content a container sees at p: a ConfigMap or Secret
// key, or a file an init container wrote into a shared emptyDir with
// `sh -c "cat A B > P"`.
func fileIn(l *layout, ps podSpec, c container, p string) (string, error) {
	vname, rel, _, ok := mountFor(c, p)
	if !ok {
		return "", fmt.Errorf("%s is on no volume of container %s", p, c.Name)
	}
	v := ps.volume(vname)
	switch {
	case v == nil:
		return "", fmt.Errorf("container %s mounts undefined volume %s", c.Name, vname)
	case v.ConfigMap != nil:
		cm, ok := l.configMaps[v.ConfigMap.Name]
		if !ok {
			return "", fmt.Errorf("volume %s: no ConfigMap generator %s", vname, v.ConfigMap.Name)
		}
		s, ok := cm[rel]
		if !ok {
			return "", fmt.Errorf("ConfigMap %s has no key %s", v.ConfigMap.Name, rel)
		}
		return s, nil
	case v.Secret != nil:
		sec, ok := l.secrets[v.Secret.SecretName]
		if !ok {
			return "", fmt.Errorf("volume %s: no Secret generator %s", vname, v.Secret.SecretName)
		}
		s, ok := sec[rel]
		if !ok {
			return "", fmt.Errorf("Secret %s has no key %s", v.Secret.SecretName, rel)
		}
		return s, nil
	case v.EmptyDir != nil:
		for _, ic := range ps.InitContainers {
			if len(ic.Command) != 3 || ic.Command[0] != "sh" || ic.Command[1] != "-c" {
				continue
			}
			m := catInto.FindStringSubmatch(ic.Command[2])
			if m == nil {
				continue
			}
			ov, orel, oro, ok := mountFor(ic, m[2])
			if !ok || ov != vname || orel != rel {
				continue
			}
			if oro {
				return "", fmt.Errorf("init container %s writes %s on a read-only mount", ic.Name, m[2])
			}
			var b strings.Builder
			for _, in := range strings.Fields(m[1]) {
				s, err := fileIn(l, ps, ic, in)
				if err != nil {
					return "", fmt.Errorf("init container %s: %w", ic.Name, err)
				}
				b.WriteString(s)
			}
			return b.String(), nil
		}
		return "", fmt.Errorf("no init container writes %s into emptyDir %s", p, vname)
	}
	return "", fmt.Errorf("%s: volume %s is neither ConfigMap, Secret nor an init container's emptyDir", p, vname)
}

// persistent reports whether the volume is a PersistentVolumeClaim.
func persistent(w workload, vname string) bool {
	for _, vct := range w.Spec.VolumeClaimTemplates {
		if vct.Metadata.Name == vname {
			return true
		}
	}
	v := w.Spec.Template.Spec.volume(vname)
	return v != nil && v.PersistentVolumeClaim != nil
}

// layoutOf names the layouts under deploy/kubernetes that run Sluice.
var sluiceLayouts = []string{"node", "fleet"}

func TestManifestsParse(t *testing.T) {
	all := map[string]bool{}
	require.NoError(t, filepath.WalkDir(deployPath(t, "kubernetes"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			all[p] = true
		}
		return err
	}))
	used := map[string]bool{}
	for _, dir := range kustomizeDirs(t) {
		t.Run(dir, func(t *testing.T) {
			l := loadLayout(t, deployPath(t, "kubernetes", dir))
			maps.Copy(used, l.files)
			require.NotEmpty(t, l.docs)
			for _, d := range l.docs {
				assert.NotEmpty(t, d.APIVersion, "%s: a document without apiVersion", d.file)
				assert.NotEmpty(t, d.Kind, "%s: a document without kind", d.file)
				assert.NotEmpty(t, d.Metadata.Name, "%s: a %s without a name", d.file, d.Kind)
				assert.Empty(t, d.Metadata.Namespace, "%s: %s %s sets its namespace; the kustomization does", d.file, d.Kind, d.Metadata.Name)
			}
			// Every container image is pinned to a tag (kustomize's images
			// sets Sluice's), and every workload's selector selects its pods.
			for _, w := range workloads(t, l) {
				assert.True(t, selects(w.Spec.Selector.MatchLabels, w.Spec.Template.Metadata.Labels), "%s selector", w.Metadata.Name)
				for _, c := range slices.Concat(w.Spec.Template.Spec.InitContainers, w.Spec.Template.Spec.Containers) {
					assert.Regexp(t, `:[\w.-]+$`, c.Image, "%s/%s image has a tag", w.Metadata.Name, c.Name)
				}
			}
		})
	}
	t.Run("no stray files", func(t *testing.T) {
		for p := range all {
			assert.True(t, used[p], "%s is in no kustomization", p)
		}
	})
	t.Run("kubectl kustomize agrees", func(t *testing.T) {
		kubectl, err := exec.LookPath("kubectl")
		if err != nil {
			t.Skip("kubectl not installed; the Go loader above checked the layouts")
		}
		for _, dir := range kustomizeDirs(t) {
			out, err := exec.Command(kubectl, "kustomize", deployPath(t, "kubernetes", dir)).CombinedOutput()
			require.NoError(t, err, "kubectl kustomize %s:\n%s", dir, out)
			l := loadLayout(t, deployPath(t, "kubernetes", dir))
			want := len(l.docs) + len(l.configMaps) + len(l.secrets)
			assert.Equal(t, want, strings.Count("\n"+string(out), "\nkind: "), "%s: objects rendered", dir)
		}
	})
}

// TestSluicePods checks each Sluice container of the layouts against its
// own config and the binary: the config passes `sluice config check`, and
// ports, probes, args, drain and volume paths agree with it.
func TestSluicePods(t *testing.T) {
	bin := sluiceBin(t)
	for _, dir := range sluiceLayouts {
		l := loadLayout(t, deployPath(t, "kubernetes", dir))
		found := 0
		for _, w := range workloads(t, l) {
			ps := w.Spec.Template.Spec
			for _, c := range ps.Containers {
				if !isSluice(c) {
					continue
				}
				found++
				t.Run(dir+"/"+w.Metadata.Name, func(t *testing.T) {
					checkSluicePod(t, bin, l, w, c)
				})
			}
		}
		assert.Equal(t, 1, found, "layout %s runs one kind of Sluice pod", dir)
	}
}

func checkSluicePod(t *testing.T, bin string, l *layout, w workload, c container) {
	ps := w.Spec.Template.Spec
	t.Run("flags exist", func(t *testing.T) { checkSluiceFlags(t, bin, c.Args) })
	cfgPath, ok := argValue(c.Args, "--config")
	require.True(t, ok, "args %v pass --config", c.Args)
	text, err := fileIn(l, ps, c, cfgPath)
	require.NoError(t, err)
	tmp := filepath.Join(t.TempDir(), "sluice.yaml")
	require.NoError(t, os.WriteFile(tmp, []byte(text), 0o600))
	code, _, stderr := runBin(t, bin, "config", "check", tmp)
	require.Equal(t, 0, code, "sluice config check of the config at %s: %s", cfgPath, stderr)
	cfg, err := config.Parse([]byte(text))
	require.NoError(t, err)

	t.Run("ports", func(t *testing.T) {
		for _, lp := range []struct{ field, addr, port string }{
			{"listen", cfg.Listen, "api"}, {"admin_listen", cfg.AdminListen, "admin"},
		} {
			host, port := listenPort(t, lp.addr)
			assert.NotContains(t, []string{"127.0.0.1", "localhost", "::1"}, host, "%s %s is unreachable from outside the pod", lp.field, lp.addr)
			got, ok := portOf(c, lp.port)
			assert.True(t, ok, "container port %q", lp.port)
			assert.Equal(t, port, got, "containerPort %s = %s's port", lp.port, lp.field)
		}
	})
	t.Run("probes", func(t *testing.T) {
		_, api := listenPort(t, cfg.Listen)
		for _, p := range []struct {
			name, path string
			probe      *probe
		}{{"readiness", "/readyz", c.ReadinessProbe}, {"liveness", "/healthz", c.LivenessProbe}} {
			require.NotNil(t, p.probe, "%s probe", p.name)
			require.NotNil(t, p.probe.HTTPGet, "%s probe is an HTTP GET", p.name)
			assert.Equal(t, p.path, p.probe.HTTPGet.Path, "%s probe path", p.name)
			port, ok := portOf(c, p.probe.HTTPGet.Port)
			assert.True(t, ok && port == api, "%s probe port %s is the API listener's %d", p.name, p.probe.HTTPGet.Port, api)
		}
	})
	t.Run("graceful drain", func(t *testing.T) {
		require.NotNil(t, ps.TerminationGracePeriodSeconds)
		pre := 0
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			pre = c.Lifecycle.PreStop.Sleep.Seconds
		}
		assert.Positive(t, pre, "a preStop sleep lets endpoints drop the pod before SIGTERM")
		need := pre + int(cfg.Server.DrainTimeout.Seconds())
		assert.Greater(t, *ps.TerminationGracePeriodSeconds, need,
			"terminationGracePeriodSeconds must exceed preStop %ds + server.drain_timeout %s", pre, cfg.Server.DrainTimeout)
	})
	t.Run("non-root, read-only root", func(t *testing.T) {
		nonRoot := (c.SecurityContext != nil && c.SecurityContext.RunAsNonRoot != nil && *c.SecurityContext.RunAsNonRoot) ||
			(ps.SecurityContext != nil && ps.SecurityContext.RunAsNonRoot != nil && *ps.SecurityContext.RunAsNonRoot)
		assert.True(t, nonRoot, "runAsNonRoot")
		require.NotNil(t, c.SecurityContext)
		assert.True(t, c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem, "readOnlyRootFilesystem")
		assert.True(t, c.SecurityContext.AllowPrivilegeEscalation != nil && !*c.SecurityContext.AllowPrivilegeEscalation, "allowPrivilegeEscalation: false")
	})
	t.Run("secrets", func(t *testing.T) {
		env := map[string]bool{}
		for _, e := range c.Env {
			env[e.Name] = true
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				assert.Contains(t, l.secrets[r.Name], r.Key, "env %s: Secret %s key %s", e.Name, r.Name, r.Key)
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				assert.Contains(t, l.configMaps[r.Name], r.Key, "env %s: ConfigMap %s key %s", e.Name, r.Name, r.Key)
			}
		}
		assert.True(t, env["SLUICE_ADMIN_TOKEN"], "the admin token comes from a Secret")
		assert.True(t, env["SLUICE_LEDGER_KEY"] || cfg.Ledger.IDKeyFile != "", "the ledger id key is set (not the built-in one)")
		if pe := cfg.Ledger.Redis.PasswordEnv; cfg.Ledger.Backend == "redis" && pe != "" {
			assert.True(t, env[pe], "ledger.redis.password_env %s is set", pe)
		}
		for name, cm := range l.configMaps {
			for key, v := range cm {
				assert.NotContains(t, v, "api_keys", "ConfigMap %s/%s holds API key hashes; keep them in a Secret", name, key)
			}
		}
	})
	t.Run("writable paths persist", func(t *testing.T) {
		// Everything the process keeps across a restart (the journal, the
		// admin state, owed outage charges, pending ledger endings) and the
		// audit trail sit on a PersistentVolumeClaim of the pod.
		writes := map[string]string{"audit.path": cfg.Audit.Path}
		for _, d := range cfg.Durability() {
			if d.Path != "" && d.Path != "redis" && d.What != "shared_state" {
				writes[d.What] = d.Path
			}
		}
		for _, d := range cfg.Durability() {
			if d.Path == "" {
				t.Errorf("%s is kept in memory only: set data_dir to a persistent volume", d.What)
			}
		}
		assert.Equal(t, config.DefaultDataDir, cfg.Paths().Dir, "the packaged layouts keep their state in data_dir %s", config.DefaultDataDir)
		for field, p := range writes {
			if p == "" {
				continue
			}
			vname, _, ro, ok := mountFor(c, path.Dir(p))
			require.True(t, ok, "%s %s is on no volume (the root filesystem is read-only)", field, p)
			assert.False(t, ro, "%s %s is on a read-only mount", field, p)
			assert.True(t, persistent(w, vname), "%s %s is on volume %s, which is not a PersistentVolumeClaim", field, p, vname)
		}
		assert.Equal(t, "StatefulSet", w.Kind, "a data directory on a PVC per pod needs a stable identity")
	})
	t.Run("upstream replicas exist", func(t *testing.T) {
		for _, r := range cfg.Upstream.Replicas {
			checkReplica(t, l, w, r, cfg)
		}
	})
	t.Run("NVML access", func(t *testing.T) {
		wantsNVML := false
		for _, r := range cfg.Upstream.Replicas {
			wantsNVML = wantsNVML || len(r.GPUs) > 0
		}
		if cfg.GPU.Telemetry == "off" || cfg.GPU.Telemetry == "vllm" || !wantsNVML {
			assert.Empty(t, c.Resources.Limits["nvidia.com/gpu"], "Sluice itself claims no GPU")
			return
		}
		assert.Equal(t, "nvidia", ps.RuntimeClassName, "the NVIDIA runtime injects NVML")
		vis := ""
		for _, e := range c.Env {
			if e.Name == "NVIDIA_VISIBLE_DEVICES" {
				vis = e.Value
			}
		}
		assert.Equal(t, "all", vis, "NVIDIA_VISIBLE_DEVICES on the sluice container")
		assert.Empty(t, c.Resources.Limits["nvidia.com/gpu"], "Sluice claims no GPU from the device plugin")
	})
	if cfg.Ledger.Backend == "redis" {
		t.Run("redis", func(t *testing.T) { checkRedis(t, l, c, cfg) })
		t.Run("PodDisruptionBudget", func(t *testing.T) { checkPDB(t, l, w) })
	}
	t.Run("services reach the pod", func(t *testing.T) {
		n := 0
		for _, s := range services(t, l) {
			if !selects(s.Spec.Selector, w.Spec.Template.Metadata.Labels) {
				continue
			}
			n++
			for _, sp := range s.Spec.Ports {
				_, ok := portOf(c, sp.TargetPort)
				assert.True(t, ok, "Service %s port %s targets %q, not a port of the sluice container", s.Metadata.Name, sp.Name, sp.TargetPort)
			}
		}
		assert.GreaterOrEqual(t, n, 2, "an API Service and the admin Service select the pod")
	})
}

// checkReplica finds the vLLM container behind an upstream URL: in the same
// pod for a loopback URL, else a StatefulSet pod behind its headless Service
// (<statefulset>-<ordinal>.<service>).
func checkReplica(t *testing.T, l *layout, w workload, r config.Replica, cfg *config.File) {
	u, err := url.Parse(r.URL)
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err, "replica %s URL %s names its port", r.Name, r.URL)
	var vc *container
	switch host := u.Hostname(); host {
	case "127.0.0.1", "localhost":
		for i, c := range w.Spec.Template.Spec.Containers {
			if isVLLM(c) {
				if p, _ := portOf(c, "vllm"); argPort(c) == port || p == port {
					vc = &w.Spec.Template.Spec.Containers[i]
				}
			}
		}
		require.NotNil(t, vc, "replica %s: no vLLM container on port %d in pod %s", r.Name, port, w.Metadata.Name)
	default:
		pod, svcName, ok := strings.Cut(host, ".")
		require.True(t, ok, "replica %s host %s is <pod>.<service>", r.Name, host)
		for _, s := range services(t, l) {
			if s.Metadata.Name == svcName {
				assert.Equal(t, "None", s.Spec.ClusterIP, "Service %s is headless: Sluice addresses each replica", svcName)
			}
		}
		for _, sw := range workloads(t, l) {
			if sw.Kind != "StatefulSet" || sw.Spec.ServiceName != svcName {
				continue
			}
			ord, found := strings.CutPrefix(pod, sw.Metadata.Name+"-")
			i, err := strconv.Atoi(ord)
			if !found || err != nil {
				continue
			}
			require.NotNil(t, sw.Spec.Replicas)
			assert.Less(t, i, *sw.Spec.Replicas, "replica %s: StatefulSet %s has only %d pods", r.Name, sw.Metadata.Name, *sw.Spec.Replicas)
			for j, c := range sw.Spec.Template.Spec.Containers {
				if isVLLM(c) {
					vc = &sw.Spec.Template.Spec.Containers[j]
				}
			}
		}
		require.NotNil(t, vc, "replica %s: no StatefulSet pod %s behind headless Service %s", r.Name, pod, svcName)
	}
	assert.Equal(t, port, argPort(*vc), "replica %s: vLLM --port", r.Name)
	seqs, ok := argValue(vc.Args, "--max-num-seqs")
	require.True(t, ok, "replica %s: vLLM sets --max-num-seqs", r.Name)
	assert.Equal(t, strconv.Itoa(r.MaxNumSeqs), seqs, "replica %s: max_num_seqs mirrors vLLM's --max-num-seqs", r.Name)
	gpus := vc.Resources.Limits["nvidia.com/gpu"]
	assert.NotEmpty(t, gpus, "replica %s: vLLM requests nvidia.com/gpu", r.Name)
	assert.Equal(t, gpus, vc.Resources.Requests["nvidia.com/gpu"], "replica %s: GPU request = limit", r.Name)
	tp := "1"
	if v, ok := argValue(vc.Args, "--tensor-parallel-size"); ok {
		tp = v
	}
	assert.Equal(t, gpus, tp, "replica %s: one GPU per tensor-parallel rank", r.Name)
	if len(r.GPUs) > 0 {
		assert.Equal(t, gpus, strconv.Itoa(len(r.GPUs)), "replica %s: gpus lists every GPU vLLM gets", r.Name)
	}
	if ml, ok := argValue(vc.Args, "--max-model-len"); ok && r.MaxModelLen > 0 {
		assert.Equal(t, ml, strconv.FormatInt(r.MaxModelLen, 10), "replica %s: max_model_len", r.Name)
	}
	require.NotNil(t, vc.ReadinessProbe)
	require.NotNil(t, vc.ReadinessProbe.HTTPGet)
	assert.Equal(t, "/health", vc.ReadinessProbe.HTTPGet.Path, "vLLM readiness")
	pp, _ := portOf(*vc, vc.ReadinessProbe.HTTPGet.Port)
	assert.Equal(t, port, pp, "vLLM readiness port")
	_ = cfg
}

func argPort(c container) int {
	v, _ := argValue(c.Args, "--port")
	n, _ := strconv.Atoi(v)
	return n
}

// checkRedis finds the Service and StatefulSet behind ledger.redis.addrs and
// checks the persistence settings LEDGER.md §6 requires.
func checkRedis(t *testing.T, l *layout, sc container, cfg *config.File) {
	for _, addr := range cfg.Ledger.Redis.Addrs {
		host, port := listenPort(t, addr)
		var svc *service
		for _, s := range services(t, l) {
			if s.Metadata.Name == host {
				svc = &s
			}
		}
		require.NotNil(t, svc, "ledger.redis.addrs %s: no Service %s", addr, host)
		var target string
		for _, p := range svc.Spec.Ports {
			if p.Port == port {
				target = p.TargetPort
			}
		}
		require.NotEmpty(t, target, "Service %s has no port %d", host, port)
		var rw *workload
		var rc *container
		for _, w := range workloads(t, l) {
			if selects(svc.Spec.Selector, w.Spec.Template.Metadata.Labels) {
				rw = &w
				rc = &w.Spec.Template.Spec.Containers[0]
			}
		}
		require.NotNil(t, rc, "Service %s selects no workload", host)
		p, ok := portOf(*rc, target)
		assert.True(t, ok && p == 6379, "Service %s targets redis-server's port", host)
		line := strings.Join(slices.Concat(rc.Command, rc.Args), " ")
		for _, want := range []string{"--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"} {
			assert.Contains(t, line, want, "redis-server runs with %s", want)
		}
		dir := regexp.MustCompile(`--dir (\S+)`).FindStringSubmatch(line)
		require.NotNil(t, dir, "redis-server --dir")
		vname, _, ro, ok := mountFor(*rc, dir[1])
		assert.True(t, ok && !ro && persistent(*rw, vname), "the AOF directory %s is on a writable PVC", dir[1])
		if pe := cfg.Ledger.Redis.PasswordEnv; pe != "" {
			assert.Contains(t, line, "--requirepass", "Sluice sends a password, so Redis requires one")
			ref := func(c container, name string) *keyRef {
				for _, e := range c.Env {
					if (name == "" || e.Name == name) && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
						if strings.Contains(line, "$"+e.Name) || name != "" {
							return e.ValueFrom.SecretKeyRef
						}
					}
				}
				return nil
			}
			assert.Equal(t, ref(*rc, ""), ref(sc, pe), "Sluice's %s and Redis's --requirepass come from the same Secret key", pe)
		}
	}
}

func checkPDB(t *testing.T, l *layout, w workload) {
	require.NotNil(t, w.Spec.Replicas)
	assert.GreaterOrEqual(t, *w.Spec.Replicas, 2, "several instances share the ledger")
	n := 0
	for _, d := range l.byKind("PodDisruptionBudget") {
		var pdb struct {
			Spec struct {
				MaxUnavailable *int `yaml:"maxUnavailable"`
				MinAvailable   *int `yaml:"minAvailable"`
				Selector       struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"selector"`
			} `yaml:"spec"`
		}
		require.NoError(t, d.node.Decode(&pdb))
		if !selects(pdb.Spec.Selector.MatchLabels, w.Spec.Template.Metadata.Labels) {
			continue
		}
		n++
		switch {
		case pdb.Spec.MaxUnavailable != nil:
			assert.Less(t, *pdb.Spec.MaxUnavailable, *w.Spec.Replicas)
			assert.Positive(t, *pdb.Spec.MaxUnavailable, "a PDB of 0 blocks node drains")
		case pdb.Spec.MinAvailable != nil:
			assert.Less(t, *pdb.Spec.MinAvailable, *w.Spec.Replicas, "a PDB of all replicas blocks node drains")
		default:
			t.Errorf("PDB %s sets neither maxUnavailable nor minAvailable", d.Metadata.Name)
		}
	}
	assert.Equal(t, 1, n, "one PodDisruptionBudget selects %s", w.Metadata.Name)
}

// TestServiceMonitors checks that the Prometheus Operator objects select the
// Services that carry Sluice's and vLLM's /metrics.
func TestServiceMonitors(t *testing.T) {
	mon := loadLayout(t, deployPath(t, "kubernetes", "monitoring"))
	fleet := loadLayout(t, deployPath(t, "kubernetes", "fleet"))
	svcs := services(t, fleet)
	sms := mon.byKind("ServiceMonitor")
	require.Len(t, sms, 2)
	for _, d := range sms {
		var sm struct {
			Spec struct {
				Selector struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"selector"`
				Endpoints []struct {
					Port string `yaml:"port"`
					Path string `yaml:"path"`
				} `yaml:"endpoints"`
			} `yaml:"spec"`
		}
		require.NoError(t, d.node.Decode(&sm))
		t.Run(d.Metadata.Name, func(t *testing.T) {
			var matched []service
			for _, s := range svcs {
				if selects(sm.Spec.Selector.MatchLabels, s.Metadata.Labels) {
					matched = append(matched, s)
				}
			}
			require.Len(t, matched, 1, "ServiceMonitor %s selects exactly one Service", d.Metadata.Name)
			require.Len(t, sm.Spec.Endpoints, 1)
			ep := sm.Spec.Endpoints[0]
			assert.Equal(t, "/metrics", ep.Path)
			var target string
			for _, p := range matched[0].Spec.Ports {
				if p.Name == ep.Port {
					target = p.TargetPort
				}
			}
			require.NotEmpty(t, target, "Service %s has no port named %s", matched[0].Metadata.Name, ep.Port)
			if d.Metadata.Name == "sluice" {
				assert.Equal(t, "admin", target, "Sluice's /metrics is on the admin listener")
			}
		})
	}
}

// TestPodMonitors checks that a PodMonitor selects pods with the named port.
func TestPodMonitors(t *testing.T) {
	mon := loadLayout(t, deployPath(t, "kubernetes", "monitoring"))
	node := loadLayout(t, deployPath(t, "kubernetes", "node"))
	pms := mon.byKind("PodMonitor")
	require.NotEmpty(t, pms)
	for _, d := range pms {
		var pm struct {
			Spec struct {
				Selector struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"selector"`
				Endpoints []struct {
					Port string `yaml:"port"`
					Path string `yaml:"path"`
				} `yaml:"podMetricsEndpoints"`
			} `yaml:"spec"`
		}
		require.NoError(t, d.node.Decode(&pm))
		require.Len(t, pm.Spec.Endpoints, 1)
		assert.Equal(t, "/metrics", pm.Spec.Endpoints[0].Path)
		n := 0
		for _, w := range workloads(t, node) {
			if !selects(pm.Spec.Selector.MatchLabels, w.Spec.Template.Metadata.Labels) {
				continue
			}
			n++
			found := false
			for _, c := range w.Spec.Template.Spec.Containers {
				_, ok := portOf(c, pm.Spec.Endpoints[0].Port)
				found = found || (ok && isVLLM(c))
			}
			assert.True(t, found, "PodMonitor %s: no vLLM container port %q in %s", d.Metadata.Name, pm.Spec.Endpoints[0].Port, w.Metadata.Name)
		}
		assert.Equal(t, 1, n, "PodMonitor %s selects the node layout's pods", d.Metadata.Name)
	}
}

func TestTenantQuota(t *testing.T) {
	l := loadLayout(t, deployPath(t, "kubernetes", "tenant-quota"))
	require.Len(t, l.byKind("ResourceQuota"), 1)
	require.Len(t, l.byKind("LimitRange"), 1)
	var rq struct {
		Spec struct {
			Hard map[string]string `yaml:"hard"`
		} `yaml:"spec"`
	}
	require.NoError(t, l.byKind("ResourceQuota")[0].node.Decode(&rq))
	assert.Contains(t, rq.Spec.Hard, "requests.nvidia.com/gpu", "the quota clamps GPUs")
	assert.NotContains(t, rq.Spec.Hard, "limits.nvidia.com/gpu", "extended resources take only requests.* quotas")
	assert.NotEqual(t, "sluice", l.namespace, "the quota applies to a tenant's namespace")
}
