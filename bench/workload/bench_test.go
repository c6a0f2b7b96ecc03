package workload

import "testing"

// BenchmarkBuildFlood draws the 4-tenant flood schedule (≈ 2,900 requests).
func BenchmarkBuildFlood(b *testing.B) {
	s, err := Parse([]byte(flood), func(string) (string, bool) { return "k", true })
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Build(s, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
