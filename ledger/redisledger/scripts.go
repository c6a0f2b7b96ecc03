package redisledger

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/ledger"
)

//go:embed lua/*.lua
var luaFS embed.FS

// scripts are the ledger's Lua scripts, each the shebang line, the shared
// prelude and its body. Writers have no flags, so an out-of-memory Redis
// refuses them up front; readers are flagged no-writes for EVALSHA_RO (and
// are read-only functions of the library too, called with FCALL_RO).
type scripts struct {
	reserve, dispatch, extend, settle, release, expire, resolve, charge, grow *redis.Script
	scan, snapshot, records                                                   *redis.Script
	// batch runs several write operations in one script call (batch.go).
	batch *redis.Script
	// names maps each write script to its operation name in batch.
	names map[*redis.Script]string
	// lib is the function library (FUNCTION LOAD) whose function fn runs a
	// batch like the batch script, keeping its parse caches across calls;
	// fnx runs a Cluster node's batch of several slots.
	lib, fn, fnx string
	// roFn names the library's read-only function of each reader (scan,
	// snapshot, records), called with FCALL_RO.
	roFn map[*redis.Script]string
	// scans is the library's read-only function that scans several
	// partitions in one call (lua/scans.lua; Run's idle pass), flagged
	// allow-cross-slot-keys for a Cluster node's partitions. It has no
	// script: without functions Run scans partition by partition.
	scans string
}

// batchOps are the write scripts the batch script embeds.
var batchOps = []string{"reserve", "dispatch", "extend", "settle", "release", "expire", "resolve", "charge", "grow"}

// dimsHeader defines NDIMS and SLOTS for the prelude, and constructors of
// tables presized for one value per dimension (index 0..NDIMS-1): ZA for
// amounts (0 each, plus n, s, nz and m), ZS and ZF (false each). Lua 5.1 has no
// table.new, and filling an empty table rehashes it at every power of two.
func dimsHeader() string {
	return dimsLine() + "local RFMT = '" + recordFormat + "'\n"
}

// recordFormat is the struct.pack format of a packed record's head
// (lua/prelude.lua, store): version, st, le, te, sl, ra, ls, at, then the
// lengths of the texts o, dg, h, sp, wi, a, src, g, na that follow it.
const recordFormat = "<BBddBdBd" + "I4I4I4I4I4I4I4I4I4"

func dimsLine() string {
	zeros := "[0]=0" + strings.Repeat(",0", int(ledger.NumDims)-1)
	falses := "[0]=false" + strings.Repeat(",false", int(ledger.NumDims)-1)
	return fmt.Sprintf("local NDIMS, SLOTS = %d, %d\n"+
		"local function ZA() return {%s, n = 0, s = false, nz = false, m = 0} end\n"+
		"local function ZS() return {%s} end\n"+
		"local ZF = ZS\n", ledger.NumDims, ledger.Slots, zeros, falses)
}

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
		b.WriteString(dimsHeader())
		b.WriteString("local KEYS, ARGV = KEYS, ARGV\n") // as the batch's prelude sees them
		b.Write(prelude)
		// The body is a function so that flush runs after every return.
		b.WriteString("\nbegin(ARGV[#ARGV])\nlocal function body()\n")
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
		{&s.resolve, "resolve", false}, {&s.charge, "charge", false}, {&s.grow, "grow", false}, {&s.scan, "scan", true}, {&s.snapshot, "snapshot", true},
		{&s.records, "records", true},
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
	// The batch: the prelude sees locals KEYS and ARGV, which run_batch
	// rebinds per operation; every body is a function.
	var ops strings.Builder
	ops.WriteString(dimsHeader())
	ops.WriteString("local KEYS, ARGV\n")
	ops.Write(prelude)
	ops.WriteString("\nlocal OPS = {}\n")
	if err := appendBodies(&ops, "OPS", batchOps); err != nil {
		return nil, err
	}
	driver, err := luaFS.ReadFile("lua/batch.lua")
	if err != nil {
		return nil, err
	}
	ops.Write(driver)
	s.batch = redis.NewScript("#!lua\nlocal KEYS0, ARGV0 = KEYS, ARGV\n" + ops.String() + "\nreturn run_batch(KEYS0, ARGV0, 0, math.huge)\n")
	// The readers, in the library only: as scripts each call re-ran the
	// whole prelude's chunk (its closures and tables), about 120 µs of
	// Redis CPU for a scan that reads two sorted sets; Run scans every
	// partition each second from every instance.
	var ro strings.Builder
	ro.WriteString("local RO = {}\n")
	readers := []struct {
		name string
		sc   *redis.Script
	}{{"scan", s.scan}, {"snapshot", s.snapshot}, {"records", s.records}}
	var names []string
	for _, r := range readers {
		names = append(names, r.name)
	}
	if err := appendBodies(&ro, "RO", append(names, "scans")); err != nil {
		return nil, err
	}
	ro.WriteString("local function run_ro(name, K, A)\n  begin(A[#A])\n  KEYS, ARGV = K, A\n  return RO[name]()\nend\n")
	// The function library runs the same code. Its chunk runs at FUNCTION
	// LOAD, where only redis.register_function is in scope, so the prelude
	// is set up at the first call, once: its parse caches (specs, amounts,
	// windows) then last across calls. The names carry the code's hash, so
	// processes of different versions on one Redis each find their own.
	sum := sha1.Sum([]byte(ops.String() + ro.String()))
	tag := hex.EncodeToString(sum[:6])
	s.fn, s.fnx = "sluice_batch_"+tag, "sluice_batchx_"+tag
	var lib strings.Builder
	lib.WriteString("#!lua name=sluice_ledger_" + tag + "\n" +
		"local run, runx, runro\nlocal function setup()\n" + ops.String() + ro.String() +
		"\nreturn run_batch, run_batch_x, run_ro\nend\n" +
		"local function init() if not run then run, runx, runro = setup() end end\n" +
		"redis.register_function('" + s.fn + "', function(keys, args)\n" +
		"  init()\n  return run(keys, args, 0, math.huge)\nend)\n" +
		// A Cluster node's batch of several slots (batch.go, lua/batch.lua).
		"redis.register_function{function_name = '" + s.fnx + "', flags = {'allow-cross-slot-keys'},\n" +
		"  callback = function(keys, args)\n  init()\n  return runx(keys, args)\nend}\n")
	s.roFn = map[*redis.Script]string{}
	for _, r := range readers {
		fn := "sluice_" + r.name + "_" + tag
		s.roFn[r.sc] = fn
		fmt.Fprintf(&lib, "redis.register_function{function_name = '%s', flags = {'no-writes'},\n"+
			"  callback = function(keys, args)\n  init()\n  return runro(%q, keys, args)\nend}\n", fn, r.name)
	}
	s.scans = "sluice_scans_" + tag
	fmt.Fprintf(&lib, "redis.register_function{function_name = '%s', flags = {'no-writes', 'allow-cross-slot-keys'},\n"+
		"  callback = function(keys, args)\n  init()\n  return runro('scans', keys, args)\nend}\n", s.scans)
	s.lib = lib.String()
	return s, nil
}

// appendBodies appends each named script body (lua/<name>.lua) to b as a
// function in the Lua table tbl: tbl["name"] = function() <body> end.
func appendBodies(b *strings.Builder, tbl string, names []string) error {
	for _, name := range names {
		body, err := luaFS.ReadFile("lua/" + name + ".lua")
		if err != nil {
			return err
		}
		fmt.Fprintf(b, "%s[%q] = function()\n", tbl, name)
		b.Write(body)
		b.WriteString("\nend\n")
	}
	return nil
}
