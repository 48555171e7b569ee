package main

import (
	"math"
	"slices"
	"time"
)

// percentile is the nearest-rank p-th percentile (0 < p ≤ 100) of samples: the smallest
// sample that at least p% of the samples are less than or equal to. Nearest rank never
// invents a value between two samples, so a p99 is always a latency that was measured.
// It returns 0 for no samples.
func percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// summary is what one run of one measurement keeps besides its raw samples.
type summary struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	Min float64 `json:"min_ms"`
}

func summarize(samples []time.Duration) summary {
	s := slices.Clone(samples)
	slices.Sort(s)
	if len(s) == 0 {
		return summary{}
	}
	return summary{
		N:   len(s),
		P50: ms(percentileSorted(s, 50)),
		P90: ms(percentileSorted(s, 90)),
		P99: ms(percentileSorted(s, 99)),
		Max: ms(s[len(s)-1]),
		Min: ms(s[0]),
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// median of per-run values: the figure the tables show, so that one noisy run does not
// move it. An even count averages the middle two.
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// runsOf collects one field of every run's summary.
func runsOf(runs []summary, f func(summary) float64) []float64 {
	out := make([]float64, len(runs))
	for i, r := range runs {
		out[i] = f(r)
	}
	return out
}
