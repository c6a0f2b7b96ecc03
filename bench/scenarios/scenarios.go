// Package scenarios embeds the bench presets of BENCH.md §9 so that
// `--workload flood` works without the repository.
package scenarios

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

//go:embed *.yaml
var files embed.FS

// Names lists the presets, sorted.
func Names() []string {
	ents, _ := fs.ReadDir(files, ".")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(out)
	return out
}

// Get returns a preset's YAML.
func Get(name string) ([]byte, error) {
	b, err := files.ReadFile(name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("no preset %q (have %s)", name, strings.Join(Names(), ", "))
	}
	return b, nil
}
