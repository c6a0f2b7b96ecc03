package redisledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/ledger"
)

// Batching. Redis spends a fixed cost on every script call (reading the
// command, looking the script up, converting its keys and arguments, writing
// the reply; about 9.5 µs of server CPU measured on a 2-core machine), and
// the client one round trip and two syscalls more. The batcher coalesces
// concurrent write operations of one group into one call of the batch
// script, which runs each operation's body in turn, exactly as its own
// script would: the batch is atomic, equal to running its operations one
// after another, and each operation answers on its own.
//
// A group is what one call may touch: the whole server for a standalone or
// Sentinel client; on a Cluster, the node that serves an operation's slot
// (every key of an operation carries its partition's hash tag), whose
// batches of several slots go to the library's cross-slot function (see
// lua/batch.lua for why that is safe while slots move), or the slot itself
// where calls go through the batch script, which cannot carry several. An
// operation that function answers TRYAGAIN (its slot was not served whole
// by that node: the client's slot map was stale, or the slot is migrating)
// never ran, and goes once more through its slot's group, whose call
// go-redis redirects like any single-slot command.
//
// Each group has at most batchInflight calls running; an operation that
// arrives while they run waits in the group's queue and goes with the next
// call (at most Config.MaxBatch operations), so batching adds no timer:
// under light load every call carries one operation, under heavy load a
// call carries what queued during the last one (like a journal's group
// commit).
//
// Every caller waits at most StoreTimeout from the moment it queued (queued
// again, for an operation sent again through its slot): an operation still
// queued then is taken out and fails ErrUnavailable (it never ran); one
// whose call is in flight fails ErrAmbiguous, as a single script would. A
// store error of the call is every operation's error; a redis.call error
// inside one operation is that operation's alone.

// batchInflight is the most batch calls one group runs at a time: two keep
// Redis busy while the client handles the previous reply.
const batchInflight = 2

type batcher struct {
	l  *Ledger
	cc *redis.ClusterClient // nil but on a Cluster

	mu     sync.Mutex      // guards groups and every bgroup and bop.taken
	groups map[any]*bgroup // by groupOf

	noFunc atomic.Bool // the server has no FUNCTION (or the ACL refuses it): EVALSHA
}

// exec runs one batch: FCALL of the library's function, which keeps its
// parse caches across calls (scripts.go), loading the library when the
// server lacks it (a restart, a failover to a replica that never got it);
// the batch script (EVALSHA) where the server has no functions or the ACL
// refuses them. Both refusals come before anything runs, so the retry is
// safe.
//
// fcall is the whole FCALL command, "fcall", the function, nk, the nk keys
// and the arguments, built once by call (go-redis's FCall would copy the
// keys and arguments into a command of its own).
//
// A cross-slot batch (x) has no batch script to fall back to: where the
// server refuses functions it fails errReroute, having run nothing.
func (b *batcher) exec(ctx context.Context, fcall []any, nk int, x bool) (any, error) {
	l := b.l
	if !b.noFunc.Load() {
		v, err := b.process(ctx, fcall, nk)
		if err == nil || (!funcMissing(err) && !funcUnsupported(err)) {
			return v, err
		}
		if funcMissing(err) {
			lerr := l.loadLibrary(ctx)
			if lerr == nil {
				// Loaded; FCALL itself may still be refused (an ACL that
				// allows FUNCTION LOAD but not FCALL).
				v, err = b.process(ctx, fcall, nk)
				if err == nil || !funcUnsupported(err) {
					return v, err
				}
			} else if !funcUnsupported(lerr) {
				return nil, lerr
			}
		}
		b.noFunc.Store(true)
	}
	if x {
		return nil, errReroute
	}
	keys := make([]string, nk)
	for i := range keys {
		keys[i] = *fcall[3+i].(*string)
	}
	return l.s.batch.Run(ctx, l.c, keys, fcall[3+nk:]...).Result()
}

// process sends one prebuilt FCALL, its keys from position 3 as FCall
// marks them (a Cluster client routes by the first).
func (b *batcher) process(ctx context.Context, fcall []any, nk int) (any, error) {
	cmd := redis.NewCmd(ctx, fcall...)
	if nk > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = b.l.c.Process(ctx, cmd)
	return cmd.Result()
}

// funcMissing: the server has functions but not this library's.
func funcMissing(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "ERR Function not found")
}

// funcUnsupported: the server has no FUNCTION/FCALL, or the ACL refuses it.
func funcUnsupported(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := strings.ToLower(rerr.Error())
	return strings.HasPrefix(msg, "noperm") || strings.Contains(msg, "unknown command") ||
		strings.Contains(msg, "unknown subcommand")
}

// loadLibrary loads the function library (on every primary of a Cluster).
// A library of this name holds this code (the name carries its hash).
func (l *Ledger) loadLibrary(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, l.s.lib).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	if cc, ok := l.c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	}
	return load(ctx, l.c)
}

type bgroup struct {
	queue   []*bop
	running int
}

// bop is one write operation: its keys and arguments, and (batched) its
// answer. Ops are pooled (getOp, putOp) with the storage their keys and
// arguments use: a string argument is a pointer into strs, which go-redis
// writes like the string, so it is not boxed into an interface per call
// (a go-redis hook reading cmd.Args() of a batch sees *string and *int64).
//
// Ownership: whoever holds an op after getOp fills it and hands it to
// runOp or batcher.do, which return it to the pool once nothing can touch
// it again. An op whose caller gave up while its batch was in flight is
// never pooled: the batch still writes r and err and sends on done.
type bop struct {
	name  string
	keys  []string
	args  []any
	taken bool          // in a call (guarded by batcher.mu)
	again bool          // never ran: route it again by its slot (set before done)
	done  chan struct{} // buffered: the batch sends once when r and err are set
	r     reply
	err   error
	t     *time.Timer // the caller's StoreTimeout, reused with the op

	kbuf [16]string
	abuf [40]any
	strs [28]string
	ints [4]int64
	ns   int // strs used
	ni   int // ints used
}

var opPool = sync.Pool{New: func() any { return &bop{done: make(chan struct{}, 1)} }}

func getOp() *bop {
	op := opPool.Get().(*bop)
	op.keys, op.args = op.kbuf[:0], op.abuf[:0]
	return op
}

// putOp returns op to the pool; nothing may reference it any more, and its
// done is empty (its one send, if any, was received).
func putOp(op *bop) {
	clear(op.kbuf[:])
	clear(op.abuf[:])
	clear(op.strs[:op.ns])
	op.name, op.keys, op.args, op.r, op.err = "", nil, nil, nil, nil
	op.taken, op.again, op.ns, op.ni = false, false, 0, 0
	opPool.Put(op)
}

// str appends the string argument s without boxing it (when room is left).
func (op *bop) str(s string) { op.args = pinArg(op.args, op.strs[:], &op.ns, s) }

// int appends the integer argument v without boxing it (when room is left).
func (op *bop) int(v int64) { op.args = pinArg(op.args, op.ints[:], &op.ni, v) }

// pinArg appends v to args as a pointer into buf's next free slot (*n of
// them used), or boxed once buf is full.
func pinArg[T any](args []any, buf []T, n *int, v T) []any {
	if *n == len(buf) {
		return append(args, v)
	}
	buf[*n] = v
	*n++
	return append(args, &buf[*n-1])
}

func newBatcher(l *Ledger) *batcher {
	cc, _ := l.c.(*redis.ClusterClient)
	return &batcher{l: l, cc: cc, groups: map[any]*bgroup{}}
}

// groupOf returns the group of an operation with keys (see the top of this
// file): nil for the whole server, a node's client, or a slot.
func (b *batcher) groupOf(ctx context.Context, keys []string) any {
	if b.cc == nil || len(keys) == 0 {
		return nil
	}
	if !b.noFunc.Load() {
		if n, err := b.cc.MasterForKey(ctx, keys[0]); err == nil {
			return n
		}
	}
	return keySlot(keys[0])
}

// do runs the write operation op (op.name set) through its group's batch
// and returns its reply, as run does for a single script. It takes op.
func (b *batcher) do(ctx context.Context, op *bop) (reply, error) {
	gk := b.groupOf(ctx, op.keys)
	for {
		g, r, err := b.wait(ctx, op, gk)
		if g != nil {
			return r, err
		}
		// Never ran (op.again): its slot's group, and a fresh slot map for
		// the operations after it.
		b.cc.ReloadState(ctx)
		b.mu.Lock()
		op.r, op.err, op.taken, op.again = nil, nil, false, false
		b.mu.Unlock()
		gk = keySlot(op.keys[0])
	}
}

// wait queues op in the group gk, runs a batch on this goroutine if the
// group has room, and waits for op's answer. It returns the group, or nil
// (and op kept) where op's batch left it to be routed again.
func (b *batcher) wait(ctx context.Context, op *bop, gk any) (*bgroup, reply, error) {
	b.mu.Lock()
	g := b.groups[gk]
	if g == nil {
		g = &bgroup{}
		b.groups[gk] = g
	}
	g.queue = append(g.queue, op)
	var batch []*bop
	if g.running < batchInflight {
		g.running++
		batch = b.takeLocked(g)
	}
	b.mu.Unlock()
	if batch != nil {
		b.run(g, batch)
	}
	// Go ≥ 1.23 timers (go.mod): after Stop or Reset no stale tick is received.
	if op.t == nil {
		op.t = time.NewTimer(b.l.cfg.StoreTimeout)
	} else {
		op.t.Reset(b.l.cfg.StoreTimeout)
	}
	select {
	case <-op.done:
		op.t.Stop()
		if op.again {
			if _, bySlot := gk.(uint16); !bySlot {
				return nil, nil, nil
			}
		}
		r, err := op.r, op.err
		putOp(op)
		return g, r, err
	case <-ctx.Done():
	case <-op.t.C:
	}
	op.t.Stop()
	b.mu.Lock()
	if !op.taken {
		for i, o := range g.queue {
			if o == op {
				g.queue = append(g.queue[:i], g.queue[i+1:]...)
				break
			}
		}
		b.mu.Unlock()
		putOp(op) // out of the queue, never sent: nothing else holds it
		b.l.m.storeErrors.WithLabelValues("unavailable").Inc()
		return g, nil, fmt.Errorf("redis ledger: queued past the store timeout, not sent: %w", ledger.ErrUnavailable)
	}
	b.mu.Unlock()
	select {
	case <-op.done: // finished meanwhile (if it never ran, its error says so)
		r, err := op.r, op.err
		putOp(op)
		return g, r, err
	default:
	}
	// The batch still holds op and will complete it: op is left to the GC.
	b.l.m.storeErrors.WithLabelValues("ambiguous").Inc()
	return g, nil, fmt.Errorf("redis ledger: no reply within the store timeout: %w", ledger.ErrAmbiguous)
}

func (b *batcher) takeLocked(g *bgroup) []*bop {
	n := min(len(g.queue), b.l.cfg.MaxBatch)
	batch := append([]*bop(nil), g.queue[:n]...)
	g.queue = append(g.queue[:0], g.queue[n:]...)
	for _, o := range batch {
		o.taken = true
	}
	return batch
}

// run calls the batch script for batch, then hands the group's next batch,
// if one queued meanwhile, to a new goroutine (so this caller returns).
func (b *batcher) run(g *bgroup, batch []*bop) {
	b.call(batch)
	b.mu.Lock()
	if len(g.queue) == 0 {
		g.running--
		b.mu.Unlock()
		return
	}
	next := b.takeLocked(g)
	b.mu.Unlock()
	go b.run(g, next)
}

func (b *batcher) call(batch []*bop) {
	l := b.l
	nk := 0
	na := 2
	x := false // several slots: the cross-slot function
	var slot0 uint16
	if b.cc != nil && len(batch[0].keys) > 0 {
		slot0 = keySlot(batch[0].keys[0])
	}
	for i, o := range batch {
		nk += len(o.keys)
		na += 3 + len(o.args)
		x = x || (i > 0 && b.cc != nil && len(o.keys) > 0 && keySlot(o.keys[0]) != slot0)
	}
	fcall := make([]any, 3, 4+nk+na)
	fcall[0], fcall[1], fcall[2] = "fcall", &l.s.fn, nk
	for i, o := range batch {
		if x && i == 1 {
			// The first operation's keys are declared; the others' follow
			// in ARGV, after their count.
			fcall[1], fcall[2] = &l.s.fnx, len(batch[0].keys)
			fcall = append(fcall, nk-len(batch[0].keys))
		}
		for i := range o.keys {
			fcall = append(fcall, &o.keys[i]) // a pointer: not boxed; o outlives the call
		}
	}
	fcall = append(fcall, len(batch))
	for _, o := range batch {
		fcall = append(fcall, o.name, len(o.keys), len(o.args))
		fcall = append(fcall, o.args...)
	}
	var fl int64
	if l.floor != nil {
		fl = l.floor()
	}
	fcall = append(fcall, fl)
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.StoreTimeout)
	l.m.batchOps.Observe(float64(len(batch)))
	v, err := b.exec(ctx, fcall, fcall[2].(int), x)
	cancel()
	arr, ok := v.([]any)
	if err == nil && (!ok || len(arr) != len(batch)) {
		err = errBatchReply
	}
	for i, o := range batch {
		switch {
		case err == errBatchReply:
			o.err = l.corrupt("unexpected batch reply")
		case x && routeRefused(err):
			// The declared slot's refusal, or no functions: nothing ran, and
			// every operation goes again through its own slot.
			o.err, o.again = l.storeErr(err), true
		case err != nil:
			o.err = l.storeErr(err)
		default:
			r, ok := arr[i].([]any)
			switch {
			case !ok || len(r) == 0:
				o.err = l.corrupt("unexpected script reply")
			case r[0] == "LUAERR":
				msg, _ := r[1].(string)
				o.err = l.storeErr(luaError(msg))
				o.again = x && strings.HasPrefix(msg, "TRYAGAIN ") // its probe failed: it never ran
			default:
				o.r = reply(r)
			}
		}
		o.done <- struct{}{} // o may be reused from here on
	}
}

// routeRefused: Redis refused a call for where its keys are (a slot moving
// or moved) before running it, or it was errReroute.
func routeRefused(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	for _, p := range []string{"TRYAGAIN ", "ASK ", "MOVED ", "CROSSSLOT "} {
		if strings.HasPrefix(rerr.Error(), p) {
			return true
		}
	}
	return false
}

var (
	errBatchReply = fmt.Errorf("batch reply")
	// errReroute: a cross-slot batch met a server that refuses functions;
	// nothing ran ("TRYAGAIN ", so storeErr calls it unavailable).
	errReroute = luaError("TRYAGAIN cross-slot batch without functions")
)

// luaError is a redis.call error raised inside one operation of a batch,
// classified like the error reply of a single script.
type luaError string

func (e luaError) Error() string { return string(e) }
func (e luaError) RedisError()   {}

// keySlot is the Cluster slot of key: CRC16 (XMODEM) of its hash tag mod
// 16384, as Redis computes it.
func keySlot(key string) uint16 {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}
