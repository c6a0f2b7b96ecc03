package scheduler

import (
	"strings"

	"github.com/sluicehq/sluice/scheduler/config"
)

// Durability: what the process keeps across a restart, and what it keeps
// only in memory. A piece kept in memory only is said at start (a log
// line), in /readyz's body and in sluice_durable_state; the process stays
// ready, since memory-only is a choice the config may make
// (data_dir: "").

// noteDurability sets the gauge, keeps the memory-only list for /readyz
// and logs where each piece is kept.
func (s *Server) noteDurability(cfg *config.File) {
	p := cfg.Paths()
	attrs := []any{"data_dir", p.Dir, "data_dir_from", p.DirFrom}
	var mem []string
	for _, d := range cfg.Durability() {
		v := 1.0
		where := d.Path
		if d.Path == "" {
			v, where = 0, "memory only"
			mem = append(mem, d.What)
		}
		s.m.Durable.WithLabelValues(d.What).Set(v)
		attrs = append(attrs, d.What, where)
	}
	s.memoryOnly = mem
	s.log.Info("durable state", attrs...)
	if len(mem) > 0 {
		s.log.Warn("state kept in memory only is lost on a restart; set data_dir (or the path keys) to keep it",
			"memory_only", strings.Join(mem, ","), "data_dir_from", p.DirFrom)
	}
}

// ReadyDetail is the line /readyz adds to a ready answer: the state kept
// in memory only, or "" when everything is durable.
func (s *Server) ReadyDetail() string {
	if len(s.memoryOnly) == 0 {
		return ""
	}
	return "memory only (lost on restart): " + strings.Join(s.memoryOnly, ", ")
}
