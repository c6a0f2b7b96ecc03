package queue

// rateRing sums dispatched cost over the last rateWindowSeconds whole
// seconds, for the Retry-After estimate.
type rateRing struct {
	sec     int64 // Unix second of the newest bucket
	sum     int64
	buckets [rateWindowSeconds]int64
}

func bucketOf(sec int64) int64 {
	return ((sec % rateWindowSeconds) + rateWindowSeconds) % rateWindowSeconds
}

func (r *rateRing) advance(sec int64) {
	if sec <= r.sec {
		return
	}
	if sec-r.sec >= rateWindowSeconds {
		r.buckets = [rateWindowSeconds]int64{}
		r.sum = 0
	} else {
		for s := r.sec + 1; s <= sec; s++ {
			i := bucketOf(s)
			r.sum -= r.buckets[i]
			r.buckets[i] = 0
		}
	}
	r.sec = sec
}

func (r *rateRing) add(nowN, cost int64) {
	sec := nowN / 1e9
	r.advance(sec)
	if sec < r.sec { // clock stepped back: count it in the newest bucket
		sec = r.sec
	}
	r.buckets[bucketOf(sec)] += cost
	r.sum += cost
}

// recent returns the cost dispatched in the window ending at nowN.
func (r *rateRing) recent(nowN int64) int64 {
	r.advance(nowN / 1e9)
	return r.sum
}
