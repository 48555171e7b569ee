package singleflight

import "fmt"

// state is a state of one of the protocol's state machines (leadState, followState).
type state interface{ ~uint8 }

// moves is a state machine's transition table: moves[from] has bit to set when to may
// follow from. A move not in it is a bug, and panics where the state changes (ADR 0076).
type moves[S state] []uint16

// to is the set of states given, for a row of a transition table.
func to[S state](states ...S) uint16 {
	var set uint16
	for _, s := range states {
		set |= 1 << s
	}
	return set
}

// allows reports whether the table lets next follow from.
func (m moves[S]) allows(from, next S) bool {
	return int(from) < len(m) && m[from]&(1<<next) != 0
}

// check panics unless the table lets next follow from.
func (m moves[S]) check(machine string, from, next S) {
	if !m.allows(from, next) {
		panic(fmt.Sprintf("singleflight: %s state %d may not follow %d (ADR 0076)", machine, next, from))
	}
}
