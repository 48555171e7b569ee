package singleflight

import "testing"

// decodeEntry parses what arrives on a stream's channel. A payload it cannot parse must
// make the followers read the stream, never panic the process's one receive goroutine
// (anyone who may PUBLISH on the prefix's channels can send one).
func TestDecodeEntryMalformedDoesNotPanic(t *testing.T) {
	for _, p := range []string{
		"9223372036854775807:x",              // length overflows i+1+n
		"3:1-0" + "9223372036854775807:t1:x", // in a field name
		"3:1-01:t9223372036854775806:x",      // in a value
		"-1:x", ":", "", "1:", "0:", "2:1-1:t",
	} {
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("decodeEntry(%q) panicked: %v", p, v)
				}
			}()
			_, _ = decodeEntry(p)
		}()
	}
}
