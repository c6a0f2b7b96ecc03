package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// doc is one YAML document of a manifest file.
type doc struct {
	file       string
	node       yaml.Node
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   meta   `yaml:"metadata"`
}

type meta struct {
	Name      string            `yaml:"name"`
	Namespace string            `yaml:"namespace"`
	Labels    map[string]string `yaml:"labels"`
}

// decodeDocs parses every document of a multi-document YAML file.
func decodeDocs(t *testing.T, file string) []*doc {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(readFile(t, file)))
	var out []*doc
	for {
		d := &doc{file: file}
		err := dec.Decode(&d.node)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err, "%s does not parse", file)
		if d.node.Kind == 0 || (len(d.node.Content) == 1 && d.node.Content[0].Tag == "!!null") {
			continue // empty document
		}
		require.NoError(t, d.node.Decode(d), "%s", file)
		out = append(out, d)
	}
}

// kustomization is the part of kustomize's file format deploy/ uses.
type kustomization struct {
	APIVersion         string      `yaml:"apiVersion"`
	Kind               string      `yaml:"kind"`
	Namespace          string      `yaml:"namespace"`
	Resources          []string    `yaml:"resources"`
	ConfigMapGenerator []generator `yaml:"configMapGenerator"`
	SecretGenerator    []generator `yaml:"secretGenerator"`
	Images             []struct {
		Name   string `yaml:"name"`
		NewTag string `yaml:"newTag"`
	} `yaml:"images"`
}

type generator struct {
	Name     string   `yaml:"name"`
	Files    []string `yaml:"files"`
	Envs     []string `yaml:"envs"`
	Literals []string `yaml:"literals"`
}

// layout is a kustomization with everything it includes, resolved the way
// kustomize does for the features deploy/ uses (resources, namespace,
// configMapGenerator and secretGenerator with files and envs). Generated
// names are kept without kustomize's hash suffix, as the manifests spell
// them.
type layout struct {
	dir        string
	namespace  string
	docs       []*doc
	configMaps map[string]map[string]string // name → key → content
	secrets    map[string]map[string]string
	files      map[string]bool // every file the layout reads
}

func loadLayout(t *testing.T, dir string) *layout {
	t.Helper()
	l := &layout{dir: dir, configMaps: map[string]map[string]string{}, secrets: map[string]map[string]string{}, files: map[string]bool{}}
	l.load(t, dir)
	return l
}

func (l *layout) load(t *testing.T, dir string) {
	t.Helper()
	kf := filepath.Join(dir, "kustomization.yaml")
	l.files[kf] = true
	var k kustomization
	dec := yaml.NewDecoder(bytes.NewReader(readFile(t, kf)))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&k), "%s uses a kustomize feature the tests do not model", kf)
	require.Equal(t, "Kustomization", k.Kind, kf)
	require.NotEmpty(t, k.Namespace, "%s sets a namespace", kf)
	if l.namespace == "" {
		l.namespace = k.Namespace
	}
	require.Equal(t, l.namespace, k.Namespace, "%s: one namespace per layout", kf)
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		st, err := os.Stat(p)
		require.NoError(t, err, "%s: resource %s", kf, r)
		if st.IsDir() {
			l.load(t, p)
			continue
		}
		l.files[p] = true
		l.docs = append(l.docs, decodeDocs(t, p)...)
	}
	gen := func(into map[string]map[string]string, gs []generator) {
		for _, g := range gs {
			require.NotContains(t, into, g.Name, "%s: generator %s defined twice", kf, g.Name)
			data := map[string]string{}
			for _, f := range g.Files {
				key, src, ok := strings.Cut(f, "=")
				if !ok {
					key, src = filepath.Base(f), f
				}
				p := filepath.Join(dir, src)
				l.files[p] = true
				data[key] = string(readFile(t, p))
			}
			for _, e := range g.Envs {
				p := filepath.Join(dir, e)
				l.files[p] = true
				sc := bufio.NewScanner(bytes.NewReader(readFile(t, p)))
				for sc.Scan() {
					line := strings.TrimSpace(sc.Text())
					if line == "" || strings.HasPrefix(line, "#") {
						continue
					}
					k, v, ok := strings.Cut(line, "=")
					require.True(t, ok, "%s: %q is not KEY=VALUE", p, line)
					data[k] = v
				}
			}
			for _, lit := range g.Literals {
				k, v, ok := strings.Cut(lit, "=")
				require.True(t, ok, "%s: literal %q", kf, lit)
				data[k] = v
			}
			into[g.Name] = data
		}
	}
	gen(l.configMaps, k.ConfigMapGenerator)
	gen(l.secrets, k.SecretGenerator)
}

// byKind returns the layout's documents of one kind.
func (l *layout) byKind(kind string) []*doc {
	var out []*doc
	for _, d := range l.docs {
		if d.Kind == kind {
			out = append(out, d)
		}
	}
	return out
}

// kustomizeDirs are the folders under deploy/kubernetes with a kustomization.
func kustomizeDirs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(deployPath(t, "kubernetes"))
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		if _, err := os.Stat(deployPath(t, "kubernetes", e.Name(), "kustomization.yaml")); e.IsDir() && err == nil {
			out = append(out, e.Name())
		}
	}
	require.NotEmpty(t, out)
	return out
}
