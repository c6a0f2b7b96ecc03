package stats

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/sluicehq/sluice/bench/loadgen"
	"github.com/sluicehq/sluice/bench/workload"
)

// Options tunes [Analyze].
type Options struct {
	// Percentiles are the pNN keys reported. Default [99] (vLLM's default).
	Percentiles []float64
	// ServiceWindow is the max_service_diff window. Default 60s.
	ServiceWindow time.Duration
	// Bin is the time-series bin for charts. Default 5s.
	Bin time.Duration
}

func (o *Options) defaults() {
	if len(o.Percentiles) == 0 {
		o.Percentiles = []float64{99}
	}
	if o.ServiceWindow == 0 {
		o.ServiceWindow = 60 * time.Second
	}
	if o.Bin == 0 {
		o.Bin = 5 * time.Second
	}
}

// Summary holds vLLM's serving metrics plus Sluice's additions for one set
// of requests. Rates divide by Duration (seconds).
type Summary struct {
	Duration              float64
	Requests              int // measured requests planned (sent or not)
	Sent                  int
	Completed             int // success + late
	Failed                int // everything else, as vLLM counts
	Good                  int // completed and meeting every SLO
	Late                  int
	TotalInputTokens      int
	TotalOutputTokens     int
	TotalChunks           int // content events of completed requests
	RequestThroughput     float64
	RequestGoodput        float64
	OutputThroughput      float64
	TotalTokenThroughput  float64
	TokenGoodput          float64
	MaxOutputTokensPerS   float64
	MaxConcurrentRequests int
	Concurrency           float64 // Σ E2EL / duration (Little's law)
	SLOAttainment         float64 // good / sent
	TTFT, TPOT, ITL, E2EL Dist
	TTFTContentDiffers    int
	EarlyEmptyChunks      int // requests with an empty chunk before their first text (loadgen.Record.EarlyEmpty)
	TokensApprox          int
	PromptOff             int                       // usage prompt_tokens > 2 % off intended
	Outcomes              map[string]map[string]int // outcome → reason ("" none) → count
	UnknownCodes          map[string]int
}

// Share is one tenant's fairness accounting (cost units).
type Share struct {
	Demand      float64
	Served      float64
	Alloc       float64
	X           float64 // Served/Alloc: 1 fair, < 1 starved
	Backlogged  bool
	ServedShare float64 // Served/C
	FairShare   float64 // Alloc/C
}

// Tenant is one tenant's results.
type Tenant struct {
	Name     string
	Role     string
	Weight   float64
	Offered  float64 // rps offered in the window
	Summary  Summary
	Share    Share
	SendLag  Dist
	Deadline float64 // s; 0 none
}

// Fairness holds the run's fairness figures (BENCH.md §6).
type Fairness struct {
	JainShare         float64
	JainSLOAttainment float64
	MaxServiceDiff    float64 // cost units per window
	MeanServiceDiff   float64
	WindowS           float64
	Capacity          float64 // C = ΣS
	Lambda            float64
}

// ScheduleStats compares the offered and achieved load.
type ScheduleStats struct {
	OfferedRate float64
	SentRate    float64
	SendLag     Dist
	NewConns    int64
	Warnings    []string
}

// TenantSeries is one tenant's charts data, one value per bin.
type TenantSeries struct {
	Name    string
	TTFTP50 []float64 // ms; NaN where no sample
	TTFTP99 []float64
	Rejects []int
	Served  []float64 // cost of successes completed in the bin
}

// Series holds time series for the HTML charts.
type Series struct {
	BinS    float64
	Tenants []TenantSeries
}

// Result is the analysed run.
type Result struct {
	Summary     Summary // measured requests (after warm-up), duration first send → last completion
	Windowed    Summary // same requests, rates over the arrival window
	WindowStart float64 // s
	WindowEnd   float64
	FromArrival struct{ TTFT, E2EL Dist }
	Schedule    ScheduleStats
	Fairness    Fairness
	Tenants     []Tenant
	Victims     *Summary // pooled victims, when an aggressor exists
	Series      Series
	Percentiles []float64
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func cost(p *workload.Plan, in, out int) float64 {
	return p.Cost.Input*float64(in) + p.Cost.Output*float64(out)
}

// good reports whether a completed request meets the tenant's SLOs, as
// vLLM's goodput does (TPOT counts as 0 for one-token outputs). With no SLO
// every completed request is good.
func good(p *workload.Plan, r *loadgen.Record) bool {
	if p.SLO.TTFTMs != nil && ms(r.TTFT()) > *p.SLO.TTFTMs {
		return false
	}
	if p.SLO.TPOTMs != nil && tpot(r) > *p.SLO.TPOTMs {
		return false
	}
	if p.SLO.E2ELMs != nil && ms(r.E2EL()) > *p.SLO.E2ELMs {
		return false
	}
	return true
}

// tpot is vLLM's TPOT in ms: (E2EL − TTFT)/(out − 1), 0 when out ≤ 1.
func tpot(r *loadgen.Record) float64 {
	if r.OutTokens <= 1 {
		return 0
	}
	return ms(r.E2EL()-r.TTFT()) / float64(r.OutTokens-1)
}

// Summarize computes the metrics of recs over duration seconds.
func Summarize(plans []workload.Plan, recs []*loadgen.Record, duration float64, ps []float64) Summary {
	s := Summary{Duration: duration, Requests: len(recs), Outcomes: map[string]map[string]int{}, UnknownCodes: map[string]int{}}
	var ttft, tp, e2el []float64
	itl := NewITLHist()
	var sumE2EL float64
	var okRecs []*loadgen.Record
	goodOut := 0
	for _, r := range recs {
		if r.Sent >= 0 {
			s.Sent++
		}
		o := string(r.Outcome)
		if s.Outcomes[o] == nil {
			s.Outcomes[o] = map[string]int{}
		}
		s.Outcomes[o][r.Reason]++
		if r.UnknownCode {
			s.UnknownCodes[r.Reason]++
		}
		if !r.Outcome.OK() {
			s.Failed++
			continue
		}
		okRecs = append(okRecs, r)
		s.Completed++
		if r.Outcome == loadgen.Late {
			s.Late++
		}
		s.TotalInputTokens += r.InTokens
		s.TotalOutputTokens += r.OutTokens
		s.TotalChunks += r.Chunks
		ttft = append(ttft, ms(r.TTFT()))
		e2el = append(e2el, ms(r.E2EL()))
		sumE2EL += r.E2EL().Seconds()
		if r.OutTokens > 1 {
			tp = append(tp, tpot(r))
		}
		for _, g := range r.ITL {
			itl.Record(g)
		}
		if r.FirstContent != r.First {
			s.TTFTContentDiffers++
		}
		if r.EarlyEmpty {
			s.EarlyEmptyChunks++
		}
		if r.TokensApprox {
			s.TokensApprox++
		}
		if r.InIntended > 0 && math.Abs(float64(r.InTokens-r.InIntended)) > 0.02*float64(r.InIntended) {
			s.PromptOff++
		}
		if good(&plans[r.Tenant], r) {
			s.Good++
			goodOut += r.OutTokens
		}
	}
	s.TTFT, s.TPOT, s.E2EL, s.ITL = NewDist(ttft, ps), NewDist(tp, ps), NewDist(e2el, ps), itl.Dist(ps)
	if duration > 0 {
		s.RequestThroughput = float64(s.Completed) / duration
		s.RequestGoodput = float64(s.Good) / duration
		s.OutputThroughput = float64(s.TotalOutputTokens) / duration
		s.TotalTokenThroughput = float64(s.TotalInputTokens+s.TotalOutputTokens) / duration
		s.TokenGoodput = float64(goodOut) / duration
		s.Concurrency = sumE2EL / duration
	}
	if s.Sent > 0 {
		s.SLOAttainment = float64(s.Good) / float64(s.Sent)
	}
	s.MaxOutputTokensPerS, s.MaxConcurrentRequests = peaks(okRecs)
	return s
}

// peaks reproduces vLLM's max_output_tokens_per_s and
// max_concurrent_requests: one-second buckets from the first successful
// send, counting content events (first + each ITL) and active requests.
func peaks(recs []*loadgen.Record) (float64, int) {
	if len(recs) == 0 {
		return 0, 0
	}
	minStart, maxEnd := recs[0].Sent, recs[0].Done
	for _, r := range recs {
		minStart = min(minStart, r.Sent)
		maxEnd = max(maxEnd, r.Done)
	}
	n := int(math.Ceil((maxEnd - minStart).Seconds())) + 1
	tokens := make([]float64, n)
	conc := make([]int, n)
	bucket := func(t time.Duration) int { return int((t - minStart).Seconds()) }
	for _, r := range recs {
		t := r.First
		if b := bucket(t); b >= 0 && b < n {
			tokens[b]++
		}
		for _, g := range r.ITL {
			t += g
			if b := bucket(t); b >= 0 && b < n {
				tokens[b]++
			}
		}
		for b := bucket(r.Sent); b <= bucket(r.Done) && b < n; b++ {
			conc[b]++
		}
	}
	return slices.Max(tokens), slices.Max(conc)
}

// WaterFill returns the demand-capped, weight-proportional allocation of
// capacity c: Aᵢ = min(Dᵢ, λwᵢ) with Σ Aᵢ = min(c, ΣD). λ is +Inf when
// every demand fits.
func WaterFill(demand, weight []float64, c float64) ([]float64, float64) {
	n := len(demand)
	alloc := make([]float64, n)
	idx := make([]int, 0, n)
	var wsum float64
	for i := range n {
		if demand[i] > 0 && weight[i] > 0 {
			idx = append(idx, i)
			wsum += weight[i]
		}
	}
	sort.Slice(idx, func(a, b int) bool { return demand[idx[a]]/weight[idx[a]] < demand[idx[b]]/weight[idx[b]] })
	rem := c
	for k, i := range idx {
		lambda := rem / wsum
		if demand[i]/weight[i] <= lambda {
			alloc[i] = demand[i]
			rem -= demand[i]
			wsum -= weight[i]
			continue
		}
		for _, j := range idx[k:] {
			alloc[j] = lambda * weight[j]
		}
		return alloc, lambda
	}
	return alloc, math.Inf(1)
}

// Jain is Jain's fairness index (Σx)²/(n·Σx²); 1 for n ≤ 1 or all equal
// (including all zero).
func Jain(xs []float64) float64 {
	if len(xs) <= 1 {
		return 1
	}
	var s, sq float64
	for _, x := range xs {
		s += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return s * s / (float64(len(xs)) * sq)
}

// Analyze computes the full result of one run. Requests intended before
// the schedule's warm-up are sent but not measured.
func Analyze(sched *workload.Schedule, run *loadgen.Result, o Options) *Result {
	o.defaults()
	ps := o.Percentiles
	res := &Result{Percentiles: ps}
	var measured []*loadgen.Record
	var first, last time.Duration = -1, 0
	var lastIntended time.Duration
	for i := range run.Records {
		r := &run.Records[i]
		if r.Intended < sched.Warmup {
			continue
		}
		measured = append(measured, r)
		if r.Sent >= 0 && (first < 0 || r.Sent < first) {
			first = r.Sent
		}
		last = max(last, r.Done)
		lastIntended = max(lastIntended, r.Intended)
	}
	dur := 0.0
	if first >= 0 {
		dur = (last - first).Seconds()
	}
	res.Summary = Summarize(sched.Tenants, measured, dur, ps)
	winEnd := sched.Duration
	if winEnd == 0 {
		winEnd = lastIntended
	}
	res.WindowStart, res.WindowEnd = sched.Warmup.Seconds(), winEnd.Seconds()
	wdur := (winEnd - sched.Warmup).Seconds()
	if wdur <= 0 {
		wdur = dur
	}
	res.Windowed = Summarize(sched.Tenants, measured, wdur, ps)

	var ttftA, e2elA, lag []float64
	byTenant := make([][]*loadgen.Record, len(sched.Tenants))
	hasAggressor := false
	for _, p := range sched.Tenants {
		hasAggressor = hasAggressor || p.Role == "aggressor"
	}
	var victims []*loadgen.Record
	for _, r := range measured {
		byTenant[r.Tenant] = append(byTenant[r.Tenant], r)
		if sched.Tenants[r.Tenant].Role != "aggressor" {
			victims = append(victims, r)
		}
		if r.Sent >= 0 {
			lag = append(lag, ms(r.Sent-r.Intended))
		}
		if r.Outcome.OK() {
			ttftA = append(ttftA, ms(r.First-r.Intended))
			e2elA = append(e2elA, ms(r.Done-r.Intended))
		}
	}
	res.FromArrival.TTFT, res.FromArrival.E2EL = NewDist(ttftA, ps), NewDist(e2elA, ps)
	if hasAggressor {
		v := Summarize(sched.Tenants, victims, dur, ps)
		res.Victims = &v
	}
	lagPs := append(slices.Clone(ps), 50, 99, 100)
	res.Schedule = ScheduleStats{SendLag: NewDist(lag, lagPs), NewConns: run.NewConns}
	res.Schedule.OfferedRate, res.Schedule.SentRate = rates(measured)

	demand := make([]float64, len(sched.Tenants))
	served := make([]float64, len(sched.Tenants))
	weights := make([]float64, len(sched.Tenants))
	for i := range sched.Tenants {
		p := &sched.Tenants[i]
		weights[i] = p.Weight
		var tl []float64
		for _, r := range byTenant[i] {
			if r.Sent >= 0 {
				demand[i] += cost(p, r.InIntended, r.OutIntended)
				tl = append(tl, ms(r.Sent-r.Intended))
			}
			if r.Outcome.OK() {
				served[i] += cost(p, r.InTokens, r.OutTokens)
			}
		}
		off, _ := rates(byTenant[i])
		if wd := (winEnd - sched.Warmup).Seconds(); wd > 0 {
			off = float64(len(byTenant[i])) / wd
		}
		res.Tenants = append(res.Tenants, Tenant{Name: p.Name, Role: p.Role, Weight: p.Weight, Offered: off,
			Summary: Summarize(sched.Tenants, byTenant[i], dur, ps), SendLag: NewDist(tl, lagPs), Deadline: p.Deadline.Seconds()})
	}
	var c float64
	for _, s := range served {
		c += s
	}
	alloc, lambda := WaterFill(demand, weights, c)
	var xs, att []float64
	for i := range res.Tenants {
		sh := Share{Demand: demand[i], Served: served[i], Alloc: alloc[i]}
		if alloc[i] > 0 {
			sh.X = served[i] / alloc[i]
		}
		sh.Backlogged = demand[i] > alloc[i]*(1+1e-9)
		if c > 0 {
			sh.ServedShare, sh.FairShare = served[i]/c, alloc[i]/c
		}
		res.Tenants[i].Share = sh
		if demand[i] > 0 {
			xs = append(xs, sh.X)
			att = append(att, res.Tenants[i].Summary.SLOAttainment)
		}
	}
	if math.IsInf(lambda, 1) {
		lambda = 0
		for i := range demand {
			if weights[i] > 0 {
				lambda = max(lambda, demand[i]/weights[i])
			}
		}
	}
	res.Fairness = Fairness{JainShare: Jain(xs), JainSLOAttainment: Jain(att), Capacity: c, Lambda: lambda,
		WindowS: o.ServiceWindow.Seconds()}
	res.Fairness.MaxServiceDiff, res.Fairness.MeanServiceDiff = ServiceDiff(sched.Tenants, measured, sched.Warmup, o.ServiceWindow)
	res.Series = series(sched.Tenants, measured, o.Bin)
	res.Schedule.Warnings = warnings(res)
	return res
}

// rates returns the offered rate (requests over the intended span) and the
// achieved send rate (sent over the send span).
func rates(recs []*loadgen.Record) (offered, sent float64) {
	if len(recs) < 2 {
		return 0, 0
	}
	iMin, iMax := recs[0].Intended, recs[0].Intended
	var sFirst, sLast time.Duration = -1, -1
	n := 0
	for _, r := range recs {
		iMin, iMax = min(iMin, r.Intended), max(iMax, r.Intended)
		if r.Sent >= 0 {
			n++
			if sFirst < 0 || r.Sent < sFirst {
				sFirst = r.Sent
			}
			sLast = max(sLast, r.Sent)
		}
	}
	if iMax > iMin {
		offered = float64(len(recs)-1) / (iMax - iMin).Seconds()
	}
	if n > 1 && sLast > sFirst {
		sent = float64(n-1) / (sLast - sFirst).Seconds()
	}
	return offered, sent
}

// ServiceDiff slides a window (1-s steps) over the run and, in each, takes
// the largest weight-normalised served-cost gap to the best-served tenant,
// each tenant's deficit capped by its own demand in the window (VTC). It
// returns the max and mean over windows, in cost units. Demand counts at
// the intended time, service at completion.
func ServiceDiff(plans []workload.Plan, recs []*loadgen.Record, start, window time.Duration) (maxGap, meanGap float64) {
	var end time.Duration
	for _, r := range recs {
		end = max(end, r.Intended, r.Done)
	}
	nb := int((end-start)/time.Second) + 1
	if nb <= 0 || len(plans) == 0 {
		return 0, 0
	}
	d := make([][]float64, len(plans))
	s := make([][]float64, len(plans))
	for i := range plans {
		d[i], s[i] = make([]float64, nb), make([]float64, nb)
	}
	bin := func(t time.Duration) int { return min(max(int((t-start)/time.Second), 0), nb-1) }
	for _, r := range recs {
		p := &plans[r.Tenant]
		if r.Sent >= 0 {
			d[r.Tenant][bin(r.Intended)] += cost(p, r.InIntended, r.OutIntended)
		}
		if r.Outcome.OK() {
			s[r.Tenant][bin(r.Done)] += cost(p, r.InTokens, r.OutTokens)
		}
	}
	wb := max(int(window/time.Second), 1)
	if wb > nb {
		wb = nb
	}
	var sum float64
	n := 0
	for lo := 0; lo+wb <= nb; lo++ {
		top := 0.0
		sn := make([]float64, len(plans))
		dn := make([]float64, len(plans))
		for i, p := range plans {
			for b := lo; b < lo+wb; b++ {
				sn[i] += s[i][b]
				dn[i] += d[i][b]
			}
			sn[i] /= p.Weight
			dn[i] /= p.Weight
			top = max(top, sn[i])
		}
		gap := 0.0
		for i := range plans {
			gap = max(gap, min(top, dn[i])-sn[i])
		}
		maxGap = max(maxGap, gap)
		sum += gap
		n++
	}
	return maxGap, sum / float64(n)
}

func series(plans []workload.Plan, recs []*loadgen.Record, bin time.Duration) Series {
	var end time.Duration
	for _, r := range recs {
		end = max(end, r.Done, r.Intended)
	}
	nb := int(end/bin) + 1
	out := Series{BinS: bin.Seconds()}
	for i, p := range plans {
		ts := TenantSeries{Name: p.Name, TTFTP50: make([]float64, nb), TTFTP99: make([]float64, nb), Rejects: make([]int, nb),
			Served: make([]float64, nb)}
		samples := make([][]float64, nb)
		for _, r := range recs {
			if r.Tenant != i {
				continue
			}
			switch {
			case r.Outcome.OK():
				b := int(r.First / bin)
				samples[b] = append(samples[b], ms(r.TTFT()))
				ts.Served[int(r.Done/bin)] += cost(&plans[i], r.InTokens, r.OutTokens)
			case r.Outcome == loadgen.Rejected && r.Done >= 0:
				ts.Rejects[int(r.Done/bin)]++
			}
		}
		for b := range nb {
			ts.TTFTP50[b], ts.TTFTP99[b] = math.NaN(), math.NaN()
			if len(samples[b]) > 0 {
				slices.Sort(samples[b])
				ts.TTFTP50[b], ts.TTFTP99[b] = Percentile(samples[b], 50), Percentile(samples[b], 99)
			}
		}
		out.Tenants = append(out.Tenants, ts)
	}
	return out
}

func warnings(res *Result) []string {
	var w []string
	s := &res.Summary
	sc := &res.Schedule
	if sc.SendLag.P["99"] > 10 || (sc.OfferedRate > 0 && sc.SentRate < 0.98*sc.OfferedRate) {
		w = append(w, fmt.Sprintf("generator lags: send lag p99 %.1f ms, sent %.2f of %.2f rps offered; trust *_from_arrival",
			sc.SendLag.P["99"], sc.SentRate, sc.OfferedRate))
	}
	if sc.NewConns > 0 {
		w = append(w, fmt.Sprintf("%d new connections opened during the run (pool or fd limit too small?)", sc.NewConns))
	}
	if s.TokensApprox > 0 {
		w = append(w, fmt.Sprintf("%d responses without usage: output tokens counted as chunks", s.TokensApprox))
	}
	if s.PromptOff > 0 {
		w = append(w, fmt.Sprintf("%d requests with prompt tokens over 2%% off the intended length", s.PromptOff))
	}
	// vLLM's chat role chunk makes ttft and ttft_content differ on every
	// chat request, directly or through any proxy: that is the engine's
	// behaviour, not a hop's, so only chunks with nothing in them count.
	if s.Completed > 0 && float64(s.EarlyEmptyChunks) > 0.01*float64(s.Completed) {
		w = append(w, fmt.Sprintf("%d of %d requests got an empty chunk (no text, role or tool call) before their first text: their ttft is earlier than ttft_content",
			s.EarlyEmptyChunks, s.Completed))
	}
	codes := make([]string, 0, len(s.UnknownCodes))
	for c := range s.UnknownCodes {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	for _, c := range codes {
		w = append(w, fmt.Sprintf("reason code %q (%d) is missing from the outcome table", c, s.UnknownCodes[c]))
	}
	return w
}
