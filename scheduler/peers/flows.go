package peers

import (
	"context"
	"errors"
	"fmt"
	"math"
	neturl "net/url"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/queue/fleet"
)

// Fleet-wide fair share: each instance's charged service and lifts per
// flow (package queue/fleet), exchanged like the replica demand through
// one hash, <prefix>:{peers}:fair (the same hash slot as the demand's on
// Redis Cluster), with the same script: stamped with Redis's clock, stale
// reports dropped, the others' returned.

// ExchangeFlows publishes this instance's flows (replacing its previous
// report) and returns the other live instances' reports by instance id. A
// report that cannot be read is left out and named in an error wrapping
// [ErrMalformed], returned with the others; any other error comes with no
// reports.
func (r *Redis) ExchangeFlows(ctx context.Context, flows []fleet.Flow) (map[string][]fleet.Flow, error) {
	var b strings.Builder
	for i, f := range flows {
		if i > 0 {
			b.WriteByte(' ')
		}
		bl := 0
		if f.Backlogged {
			bl = 1
		}
		// Tenant names are escaped so that a report is space-separated.
		fmt.Fprintf(&b, "%s %d %s %s %d %d", neturl.PathEscape(f.Tenant), f.Band,
			strconv.FormatFloat(f.Service, 'g', -1, 64), strconv.FormatFloat(f.Lifted, 'g', -1, 64), bl, f.Gen)
	}
	vals, err := exchangeScript.Run(ctx, r.c, []string{r.key + ":fair"}, r.id, b.String(), r.stale.Milliseconds()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("peers: exchange flows: %w", err)
	}
	out := map[string][]fleet.Flow{}
	var bad []error
	for i := 0; i+1 < len(vals); i += 2 {
		fs, err := parseFlows(vals[i], vals[i+1])
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out[vals[i]] = fs
	}
	return out, errors.Join(bad...)
}

// parseFlows reads instance id's report "<ms> (<tenant> <band> <service>
// <lifted> <backlogged 0|1> <gen>)*", whole or not at all.
func parseFlows(id, text string) ([]fleet.Flow, error) {
	f := strings.Fields(text)
	bad := fmt.Errorf("peers: instance %q: %w flows %q", id, ErrMalformed, text)
	const fields = 6
	if len(f) == 0 || (len(f)-1)%fields != 0 {
		return nil, bad
	}
	out := make([]fleet.Flow, 0, (len(f)-1)/fields)
	for i := 1; i < len(f); i += fields {
		tenant, err0 := neturl.PathUnescape(f[i])
		band, err1 := strconv.Atoi(f[i+1])
		svc, err2 := strconv.ParseFloat(f[i+2], 64)
		lifted, err3 := strconv.ParseFloat(f[i+3], 64)
		gen, err4 := strconv.ParseInt(f[i+5], 10, 32)
		if errors.Join(err0, err1, err2, err3, err4) != nil || (f[i+4] != "0" && f[i+4] != "1") ||
			math.IsNaN(svc) || math.IsInf(svc, 0) || math.IsNaN(lifted) || math.IsInf(lifted, 0) {
			return nil, bad
		}
		out = append(out, fleet.Flow{Tenant: tenant, Band: band, Service: svc, Lifted: lifted, Backlogged: f[i+4] == "1", Gen: int32(gen)})
	}
	return out, nil
}

// LeaveFlows removes this instance's flow report. Its service stays
// counted where it was applied; it only stops being read.
func (r *Redis) LeaveFlows(ctx context.Context) error {
	if err := r.c.HDel(ctx, r.key+":fair", r.id).Err(); err != nil {
		return fmt.Errorf("peers: leave flows: %w", err)
	}
	return nil
}
