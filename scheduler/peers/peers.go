package peers

import (
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Report is one instance's demand on one replica.
type Report struct {
	Replica  string // the replica's key (Redis.Key): instances name replicas as they like
	InFlight int64  // requests this instance has running there
	Queued   int64  // requests it has queued that the replica could serve, and room kept for light tenants' peaks
	// Tenants is the same demand by tenant, so that the batch is split
	// by the tenants' weights across instances, not by instance.
	Tenants []TenantDemand
}

// TenantDemand is one tenant's demand at one instance on one replica, in
// thousandths of a request: a pool's demand is spread over its replicas.
type TenantDemand struct {
	Tenant string
	Weight int64 // its fair-share weight, at least 1
	// Load is its averaged demand, which classifies it as light or heavy
	// (the dispatch gate's).
	Load int64
	// Claim is what it asks now: requests holding room there, queued
	// that it could serve, and room kept for its peaks.
	Claim int64
	// Queued is the part of Claim queued now: a light tenant with
	// requests waiting takes a flood's instance's floor (fleet.Split).
	Queued int64
	// Held is the part of Claim holding room there now (in flight): the
	// rest is what it queues and the room kept for its peaks, which
	// server.reserve_cap bounds (fleet.SplitPool). A version that does
	// not send it is read as holding all of Claim but its queued part,
	// so that the cap binds none of its claim, as before.
	Held int64
	// Steady: its instance's gate reads it light and steady (a closed
	// loop's fixed clients: its peak is its long-run load), so the split
	// keeps no Poisson margin for its claim (gate.Gate.Steady).
	Steady bool
	// Stands: this instance's gate lets the tenant through as no flood
	// while its queue has stood (gate.Gate.Stands). Only this instance's
	// own split reads it (fleet.SplitPool binds such a tenant here), so
	// it is not exchanged.
	Stands bool
}

// Entry is another instance's Report on a replica. Tenants is nil in a
// report of a version that did not send them.
type Entry struct {
	Instance string
	InFlight int64
	Queued   int64
	Tenants  []TenantDemand
}

// Redis exchanges reports through one Redis hash. It is safe for
// concurrent use; the client should have ContextTimeoutEnabled.
type Redis struct {
	c     redis.UniversalClient
	key   string
	id    string
	host  string
	stale time.Duration
}

// NewRedis returns the exchange of instance id, running on host, under key
// prefix (the ledger's key_prefix). Reports older than stale are ignored
// and removed. It does not own c.
func NewRedis(c redis.UniversalClient, prefix, id, host string, stale time.Duration) *Redis {
	if prefix == "" {
		prefix = "sluice"
	}
	return &Redis{c: c, key: prefix + ":{peers}", id: id, host: host, stale: stale}
}

// ID is this instance's id in the exchange.
func (r *Redis) ID() string { return r.id }

// Key names the replica at url in the exchange: the URL, except that a
// loopback one (localhost, 127.0.0.0/8, ::1) is qualified by this host's
// name. Every node of a fleet may call its own vLLM http://127.0.0.1:8000;
// those are different replicas, shared only by instances on one host.
func (r *Redis) Key(url string) string {
	u, err := neturl.Parse(url)
	if err != nil {
		return url
	}
	h := u.Hostname()
	ip := net.ParseIP(h)
	if h == "localhost" || strings.HasSuffix(h, ".localhost") || (ip != nil && ip.IsLoopback()) {
		return "host=" + r.host + ":" + url
	}
	return url
}

// exchangeScript: KEYS[1] the hash; ARGV 1 the instance id, 2 its report,
// 3 the staleness bound in ms. It stamps the report with Redis's clock,
// removes stale reports and answers the other live ones (id, report
// pairs). The hash expires when no instance has written it for 10 bounds.
var exchangeScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stale = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], now .. ' ' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], 10 * stale)
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local ts = tonumber(string.match(all[i + 1], '^(%d+)'))
  if not ts or ts + stale < now then
    redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] ~= ARGV[1] then
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
`)

// Exchange publishes this instance's reports (replacing its previous ones)
// and returns the other live instances' entries by replica key. A report
// that cannot be read is left out and named in an error wrapping
// [ErrMalformed], returned with the entries of the rest; any other error
// comes with no entries.
func (r *Redis) Exchange(ctx context.Context, reports []Report) (map[string][]Entry, error) {
	var b strings.Builder
	for i, rp := range reports {
		if strings.ContainsAny(rp.Replica, " \t\r\n") || rp.Replica == "" || strings.ContainsRune("@!^", rune(rp.Replica[0])) {
			return nil, fmt.Errorf("peers: replica URL %q cannot be reported", rp.Replica)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s %d %d", rp.Replica, rp.InFlight, rp.Queued)
		for _, td := range rp.Tenants {
			if td.Weight < 1 || td.Load < 0 || td.Claim < 0 {
				return nil, fmt.Errorf("peers: tenant %q: demand %+v cannot be reported", td.Tenant, td)
			}
			if td.Queued < 0 || td.Queued > td.Claim || td.Held < 0 || td.Held > td.Claim {
				return nil, fmt.Errorf("peers: tenant %q: demand %+v cannot be reported", td.Tenant, td)
			}
			fmt.Fprintf(&b, " @%d:%s %d %d", td.Weight, neturl.PathEscape(td.Tenant), td.Load, td.Claim)
		}
		// After every tenant item, so that a version that does not know
		// them takes each for a replica it does not have, and the tenant
		// items still follow their own replica's.
		for _, td := range rp.Tenants {
			if td.Queued > 0 {
				fmt.Fprintf(&b, " !%s %d 0", neturl.PathEscape(td.Tenant), td.Queued)
			}
		}
		// After those, for the same reason: a version that reads queued
		// parts but not these takes them for replicas too.
		for _, td := range rp.Tenants {
			steady := 0
			if td.Steady {
				steady = 1
			}
			fmt.Fprintf(&b, " ^%s %d %d", neturl.PathEscape(td.Tenant), td.Held, steady)
		}
	}
	vals, err := exchangeScript.Run(ctx, r.c, []string{r.key}, r.id, b.String(), r.stale.Milliseconds()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("peers: exchange: %w", err)
	}
	out := map[string][]Entry{}
	var bad []error
	for i := 0; i+1 < len(vals); i += 2 {
		if err := parse(vals[i], vals[i+1], out); err != nil {
			bad = append(bad, err)
		}
	}
	return out, errors.Join(bad...)
}

// ErrMalformed marks a report Exchange could not read (another version's,
// or a damaged one).
var ErrMalformed = errors.New("malformed report")

// parse adds instance id's report text to out, whole or not at all:
//
//	<ms> (<url> <in flight> <queued> (@<weight>:<tenant> <load> <claim>)* (!<tenant> <queued> 0)* (^<tenant> <held> <steady>)*)*
//
// Every item is three fields, the tenants' after their replica's, their
// queued parts (only those above 0) after the tenants', and their held
// parts and steadiness (0 or 1) after those, so that a version that reads
// only replicas, or replicas and tenants, or those and queued parts, takes
// an item it does not know for a replica it does not have and ignores it
// (a rolling upgrade, docs/upgrading.md). A tenant with no held item (an
// older version's) is read as holding its claim but its queued part.
// Tenant names are escaped so that a report is space-separated.
func parse(id, text string, out map[string][]Entry) error {
	f := strings.Fields(text)
	bad := fmt.Errorf("peers: instance %q: %w %q", id, ErrMalformed, text)
	if len(f) == 0 || (len(f)-1)%3 != 0 {
		return bad
	}
	var es []Entry
	var urls []string
	held := map[heldKey]bool{}
	for i := 1; i < len(f); i += 3 {
		a, err1 := strconv.ParseInt(f[i+1], 10, 64)
		b, err2 := strconv.ParseInt(f[i+2], 10, 64)
		if errors.Join(err1, err2) != nil || a < 0 || b < 0 {
			return bad
		}
		if name, ok := strings.CutPrefix(f[i], "^"); ok {
			tenant, err := neturl.PathUnescape(name)
			if err != nil || len(es) == 0 || b > 1 {
				return bad
			}
			ts := es[len(es)-1].Tenants
			j := slices.IndexFunc(ts, func(td TenantDemand) bool { return td.Tenant == tenant })
			k := heldKey{len(es) - 1, tenant}
			if j < 0 || a > ts[j].Claim || held[k] {
				return bad
			}
			ts[j].Held, ts[j].Steady = a, b == 1
			held[k] = true
			continue
		}
		if name, ok := strings.CutPrefix(f[i], "!"); ok {
			tenant, err := neturl.PathUnescape(name)
			if err != nil || len(es) == 0 {
				return bad
			}
			ts := es[len(es)-1].Tenants
			j := slices.IndexFunc(ts, func(td TenantDemand) bool { return td.Tenant == tenant })
			if j < 0 || a > ts[j].Claim {
				return bad
			}
			ts[j].Queued = a
			continue
		}
		key, isTenant := strings.CutPrefix(f[i], "@")
		if !isTenant {
			es = append(es, Entry{Instance: id, InFlight: a, Queued: b})
			urls = append(urls, f[i])
			continue
		}
		ws, name, ok := strings.Cut(key, ":")
		w, err3 := strconv.ParseInt(ws, 10, 64)
		tenant, err4 := neturl.PathUnescape(name)
		if !ok || errors.Join(err3, err4) != nil || w < 1 || len(es) == 0 {
			return bad
		}
		e := &es[len(es)-1]
		e.Tenants = append(e.Tenants, TenantDemand{Tenant: tenant, Weight: w, Load: a, Claim: b})
	}
	for i, e := range es {
		for j, td := range e.Tenants {
			if !held[heldKey{i, td.Tenant}] {
				e.Tenants[j].Held = td.Claim - td.Queued
			}
		}
		out[urls[i]] = append(out[urls[i]], e)
	}
	return nil
}

// heldKey is a tenant of the i-th entry of a report, whose held item parse
// has read.
type heldKey struct {
	entry  int
	tenant string
}

// Leave removes this instance's reports, so that the others stop sharing
// with it at once rather than when its reports age out.
func (r *Redis) Leave(ctx context.Context) error {
	if err := r.c.HDel(ctx, r.key, r.id).Err(); err != nil {
		return fmt.Errorf("peers: leave: %w", err)
	}
	return nil
}
