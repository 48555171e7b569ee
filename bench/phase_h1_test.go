package main

import "testing"

func TestH1NFitsTheFileLimit(t *testing.T) {
	if n, note := h1N(10000, 65536); n != 10000 || note != "" {
		t.Errorf("h1N(10000, 65536) = %d, %q; want 10000 and no note", n, note)
	}
	if n, note := h1N(10000, 20000); n != 9744 || note == "" {
		t.Errorf("h1N(10000, 20000) = %d, %q; want 9744 and a note", n, note)
	}
}

func TestH1RatiosPairEachRunWhateverItsOrder(t *testing.T) {
	own := h1Row{Transport: h1Own, N: 10, RSS: 100 << 10, Heap: 50 << 10, Stack: 10 << 10, Goroutines: 20, CPUSeconds: 1}
	other := h1Row{Transport: h1NetHTTP, N: 10, RSS: 200 << 10, Heap: 100 << 10, Stack: 20 << 10, Goroutines: 40, CPUSeconds: 4}
	r := h1RatiosOf([]h1Row{own, other, other, own})
	for name, got := range map[string][]float64{"RSS": r.RSS, "live": r.Live, "heap": r.Heap, "goroutines": r.Goroutines} {
		if len(got) != 2 || got[0] != 0.5 || got[1] != 0.5 {
			t.Errorf("%s ratios %v; want [0.5 0.5]", name, got)
		}
	}
	if r.CPU[0] != 0.25 || r.CPU[1] != 0.25 {
		t.Errorf("CPU ratios %v; want [0.25 0.25]", r.CPU)
	}
}
