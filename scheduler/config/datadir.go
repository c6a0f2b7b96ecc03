package config

import (
	"fmt"
	"path/filepath"
	"sort"
)

// Fixed names inside data_dir. The shared documents (SharedAdminName,
// KeysName) are kept by the embedded ledger's state store next to the
// journal; the others belong to one process.
const (
	JournalName     = "journal"          // ledger.journal (embedded ledger)
	AdminStateName  = "admin-local.json" // admin.state_file
	SharedAdminName = "admin-state.json" // the node's shared admin state, next to the journal
	KeysName        = "api-keys.json"    // API keys minted through the admin API, next to the journal
	PendingName     = "pending.jsonl"    // the pending-writes log: ledger endings not yet acknowledged and owed outage charges
	OutageName      = "outage.json"      // owed outage charges of older versions: read once and moved into PendingName
	OutboxName      = "outbox.jsonl"     // pending endings of older versions: read once and moved into PendingName
	LockName        = "lock"             // held by the process that owns the directory
)

// DefaultDataDir is the data directory of the packaged layouts (container
// image, systemd unit, Kubernetes manifests).
const DefaultDataDir = "/var/lib/sluice"

// StatePaths is where each piece of durable state is kept, resolved from
// data_dir and the path keys that override it. "" keeps that piece in
// memory only: a restart loses it.
type StatePaths struct {
	// Dir is the data directory; "" when there is none.
	Dir string
	// DirFrom says where Dir came from: "data_dir", "the config file's
	// directory", or why there is none.
	DirFrom string
	// Journal is the embedded ledger's journal ("" with the Redis ledger,
	// whose state Redis keeps).
	Journal    string
	AdminState string
	// Pending is the pending-writes log: ledger endings the store has not
	// acknowledged and outage charges still owed to the ledger.
	Pending string
	// LegacyOutage and LegacyOutbox are where older versions kept the
	// owed charges and the pending endings; a start moves what they hold
	// into Pending and removes them. "" where Pending is "".
	LegacyOutage string
	LegacyOutbox string
}

// Durable is one piece of state and where it is kept ("" = memory only).
type Durable struct {
	What string
	Path string
}

// Durability lists what the process keeps and where, in a fixed order:
// ledger, shared_state, admin_state, outage_charges, pending_endings.
// The last two are kept in one file, the pending-writes log; both names
// stay so that dashboards reading either keep working.
func (f *File) Durability() []Durable {
	p := f.Paths()
	ledger, shared := p.Journal, ""
	switch {
	case f.Ledger.Backend == "redis":
		ledger, shared = "redis", "redis"
	case p.Journal != "":
		shared = filepath.Dir(p.Journal)
	}
	return []Durable{{"ledger", ledger}, {"shared_state", shared}, {"admin_state", p.AdminState},
		{"outage_charges", p.Pending}, {"pending_endings", p.Pending}}
}

// Paths returns where durable state is kept. A File that Load or Parse did
// not resolve (one built in code) keeps ledger.journal and
// admin.state_file as set and the pending-writes log next to them.
func (f *File) Paths() StatePaths {
	if f.paths != nil {
		return *f.paths
	}
	p := StatePaths{DirFrom: "no data_dir", AdminState: f.Admin.StateFile}
	if f.Ledger.Backend != "redis" {
		p.Journal = f.Ledger.Journal
	}
	switch {
	case f.Admin.StateFile != "":
		p.setPending(f.Admin.StateFile, false)
	case f.Ledger.Journal != "":
		p.setPending(f.Ledger.Journal, false)
	}
	return p
}

// resolvePaths fills ledger.journal and admin.state_file from data_dir
// where the file does not set them, and records every path. cfgDir is the
// config file's directory; fromFile is false for bytes with no file (then
// there is no default data directory).
//
// An explicit ledger.journal or admin.state_file keeps the pending-writes
// log next to it (<path>.pending.jsonl), where a configuration without
// data_dir kept the older files (<path>.outage.json, <path>.outbox.jsonl),
// so an upgrade finds them.
func (f *File) resolvePaths(cfgDir string, fromFile bool) {
	_, dirSet := f.lines["data_dir"]
	_, journalSet := f.lines["ledger.journal"]
	_, stateSet := f.lines["admin.state_file"]
	p := StatePaths{}
	switch {
	case dirSet && f.DataDir == "":
		p.DirFrom = `data_dir: "" (memory only)`
	case dirSet:
		p.Dir, p.DirFrom = f.DataDir, "data_dir"
	case fromFile:
		p.Dir, p.DirFrom = cfgDir, "the config file's directory"
	default:
		p.DirFrom = "no data_dir and no config file path"
	}
	if p.Dir != "" {
		if !journalSet && f.Ledger.Backend != "redis" {
			f.Ledger.Journal = filepath.Join(p.Dir, JournalName)
		}
		if !stateSet {
			f.Admin.StateFile = filepath.Join(p.Dir, AdminStateName)
		}
	}
	if f.Ledger.Backend != "redis" {
		p.Journal = f.Ledger.Journal
	}
	p.AdminState = f.Admin.StateFile
	switch {
	case stateSet && f.Admin.StateFile != "":
		p.setPending(f.Admin.StateFile, false)
	case journalSet && f.Ledger.Journal != "" && f.Ledger.Backend != "redis":
		p.setPending(f.Ledger.Journal, false)
	case p.Dir != "":
		p.setPending(p.Dir, true)
	}
	f.paths = &p
}

// setPending places the pending-writes log and the older files it
// replaces: inside dir (in, the fixed names), or next to the file base.
func (p *StatePaths) setPending(base string, in bool) {
	if in {
		p.Pending = filepath.Join(base, PendingName)
		p.LegacyOutage = filepath.Join(base, OutageName)
		p.LegacyOutbox = filepath.Join(base, OutboxName)
		return
	}
	p.Pending = base + "." + PendingName
	p.LegacyOutage = base + "." + OutageName
	p.LegacyOutbox = base + "." + OutboxName
}

// checkPaths refuses two pieces of state kept in one file: each writer
// would overwrite the other's, and a change one of them acknowledged
// would not be the one in force.
func (f *File) checkPaths(v *validator) {
	p := f.Paths()
	type named struct{ key, path string }
	var files []named
	add := func(key, path string) {
		if path != "" {
			files = append(files, named{key, path})
		}
	}
	add("ledger.journal", p.Journal)
	if p.Journal != "" {
		dir := filepath.Dir(p.Journal)
		add("the shared admin state ("+SharedAdminName+" next to ledger.journal)", filepath.Join(dir, SharedAdminName))
		add("the API key store ("+KeysName+" next to ledger.journal)", filepath.Join(dir, KeysName))
	}
	add("admin.state_file", p.AdminState)
	add("the pending-writes log", p.Pending)
	// Read once at start and then removed: no other file may be named so.
	add("older versions' owed outage charges", p.LegacyOutage)
	add("older versions' pending endings", p.LegacyOutbox)
	add("audit.path", f.Audit.Path)
	seen := map[string]string{}
	var dups []string
	for _, n := range files {
		abs, err := filepath.Abs(n.path)
		if err != nil {
			abs = filepath.Clean(n.path)
		}
		if other, dup := seen[abs]; dup {
			dups = append(dups, fmt.Sprintf("%s %q is the same file as %s: both would write it, each overwriting the other", keyFirst(n.key, other), n.path, keySecond(n.key, other)))
			continue
		}
		seen[abs] = n.key
	}
	sort.Strings(dups)
	for _, d := range dups {
		v.add("%s", d)
	}
}

// keyFirst puts a config key ahead of a derived file in a message, so the
// problem is located on the line that sets the key.
func keyFirst(a, b string) string {
	if isKey(b) && !isKey(a) {
		return b
	}
	return a
}

func keySecond(a, b string) string {
	if keyFirst(a, b) == a {
		return b
	}
	return a
}

func isKey(s string) bool {
	for _, c := range s {
		if c == ' ' {
			return false
		}
	}
	return true
}
