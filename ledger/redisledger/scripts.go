package redisledger

import (
	"embed"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/ledger"
)

//go:embed lua/*.lua
var luaFS embed.FS

// scripts are the ledger's Lua scripts, each the shebang line, the shared
// prelude and its body. Writers have no flags, so an out-of-memory Redis
// refuses them up front; readers are flagged no-writes for EVALSHA_RO.
type scripts struct {
	reserve, dispatch, extend, settle, release, expire, resolve, charge *redis.Script
	scan, snapshot                                                      *redis.Script
	// batch runs several write operations in one script call (batch.go).
	batch *redis.Script
	// names maps each write script to its operation name in batch.
	names map[*redis.Script]string
}

// batchOps are the write scripts the batch script embeds.
var batchOps = []string{"reserve", "dispatch", "extend", "settle", "release", "expire", "resolve", "charge"}

func loadScripts() (*scripts, error) {
	prelude, err := luaFS.ReadFile("lua/prelude.lua")
	if err != nil {
		return nil, err
	}
	mk := func(name string, readOnly bool) (*redis.Script, error) {
		body, err := luaFS.ReadFile("lua/" + name + ".lua")
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		if readOnly {
			b.WriteString("#!lua flags=no-writes\n")
		} else {
			b.WriteString("#!lua\n")
		}
		// The dimensions come from the ledger package, so adding one changes
		// every script (and its SHA) without touching the Lua.
		fmt.Fprintf(&b, "local NDIMS, SLOTS = %d, %d\n", ledger.NumDims, ledger.Slots)
		b.Write(prelude)
		// The body is a function so that flush runs after every return.
		b.WriteString("\nlocal function body()\n")
		b.Write(body)
		b.WriteString("\nend\nlocal r = body()\nflush()\nreturn r\n")
		return redis.NewScript(b.String()), nil
	}
	s := &scripts{names: map[*redis.Script]string{}}
	for _, x := range []struct {
		dst  **redis.Script
		name string
		ro   bool
	}{
		{&s.reserve, "reserve", false}, {&s.dispatch, "dispatch", false}, {&s.extend, "extend", false},
		{&s.settle, "settle", false}, {&s.release, "release", false}, {&s.expire, "expire", false},
		{&s.resolve, "resolve", false}, {&s.charge, "charge", false}, {&s.scan, "scan", true}, {&s.snapshot, "snapshot", true},
	} {
		sc, err := mk(x.name, x.ro)
		if err != nil {
			return nil, err
		}
		*x.dst = sc
		if !x.ro {
			s.names[sc] = x.name
		}
	}
	// The batch script: the prelude sees chunk-level locals KEYS and ARGV,
	// which the driver rebinds per operation; every body is a function.
	var b strings.Builder
	b.WriteString("#!lua\n")
	fmt.Fprintf(&b, "local NDIMS, SLOTS = %d, %d\n", ledger.NumDims, ledger.Slots)
	b.WriteString("local KEYS, ARGV = KEYS, ARGV\n")
	b.Write(prelude)
	b.WriteString("\nlocal OPS = {}\n")
	for _, name := range batchOps {
		body, err := luaFS.ReadFile("lua/" + name + ".lua")
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "OPS[%q] = function()\n", name)
		b.Write(body)
		b.WriteString("\nend\n")
	}
	driver, err := luaFS.ReadFile("lua/batch.lua")
	if err != nil {
		return nil, err
	}
	b.Write(driver)
	s.batch = redis.NewScript(b.String())
	return s, nil
}
