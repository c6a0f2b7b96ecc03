package scheduler

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/scheduler/config"
)

// restartOnly are the config fields read once, when the process starts
// (scheduler.New and node.Run): the listeners, the ledger and its store,
// the replica set and its poller, GPU telemetry, the audit trail, the trace exporter, the
// admin state file, the API listener's body limit and the fair-share scope. A reload cannot
// apply them; RestartNeeded names those that differ. ledger.lease_ttl is
// applied by a reload, and a changed ledger.tombstone_retention is refused
// (checkLeaseConfig), so neither is listed.
var restartOnly = []string{
	"listen", "admin_listen", "data_dir", "ledger", "upstream.replicas", "upstream.discovery", "upstream.scrape_interval", "upstream.learn_scrape_interval", "upstream.learn_ramp",
	"upstream.down_after", "gpu", "audit", "tracing", "admin.state_file", "server.max_body_bytes",
	"server.fair_share",
}

var reloadable = []string{"ledger.lease_ttl", "ledger.tombstone_retention"}

// RestartNeeded lists the restart-only fields whose value in the config
// in force (the last one loaded) differs from the one the process started
// with, each as "path (started → configured)": the process still runs with
// the started value until it restarts.
func (s *Server) RestartNeeded() []string {
	return restartDiff(s.boot, s.pol.Load().File)
}

func restartDiff(boot, cur *config.File) []string {
	if boot == nil || cur == nil {
		return []string{}
	}
	out := []string{}
	for _, root := range restartOnly {
		a, b := fieldByPath(reflect.ValueOf(boot).Elem(), root), fieldByPath(reflect.ValueOf(cur).Elem(), root)
		diffValues(root, a, b, &out)
	}
	return slices.DeleteFunc(out, func(p string) bool {
		name, _, _ := strings.Cut(p, " ")
		return slices.Contains(reloadable, name)
	})
}

// fieldByPath follows yaml field names ("upstream.replicas") from v.
func fieldByPath(v reflect.Value, path string) reflect.Value {
	for name := range strings.SplitSeq(path, ".") {
		t := v.Type()
		for i := range t.NumField() {
			if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag == name {
				v = v.Field(i)
				break
			}
		}
	}
	return v
}

// diffValues appends the paths under path where a and b differ: struct
// fields by yaml name, list elements by index (a list of another length is
// one difference), scalars with both values.
func diffValues(path string, a, b reflect.Value, out *[]string) {
	switch a.Kind() {
	case reflect.Struct:
		t := a.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if tag == "" || tag == "-" || !f.IsExported() {
				continue
			}
			diffValues(path+"."+tag, a.Field(i), b.Field(i), out)
		}
		return
	case reflect.Slice:
		if a.Len() != b.Len() {
			*out = append(*out, fmt.Sprintf("%s (%d entries → %d)", path, a.Len(), b.Len()))
			return
		}
		for i := range a.Len() {
			diffValues(fmt.Sprintf("%s[%d]", path, i), a.Index(i), b.Index(i), out)
		}
		return
	}
	if !reflect.DeepEqual(a.Interface(), b.Interface()) {
		*out = append(*out, fmt.Sprintf("%s (%v → %v)", path, a.Interface(), b.Interface()))
	}
}
