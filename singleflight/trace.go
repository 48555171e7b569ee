package singleflight

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// phase is a part of a lead that takes time, traced as one span (ADR 0061): the look-up of
// the key (lookup.lua, and claim.lua when the key is free), the wait for another owner, or
// a takeover (the jitter, then the look-up and claim that follow it).
type phase uint8

const (
	phaseNone phase = iota
	phaseLookup
	phaseWait
	phaseTakeover
)

var phaseNames = [...]string{phaseLookup: "dedupe.lookup", phaseWait: "dedupe.wait", phaseTakeover: "dedupe.takeover"}

// phaseOf is the phase of st, entered from cur.
func phaseOf(st leadState, cur phase) phase {
	switch st {
	case leadLookup, leadClaim:
		if cur == phaseTakeover {
			return phaseTakeover // its own look-up and claim
		}
		return phaseLookup
	case leadContend, leadRetry:
		return phaseTakeover
	case leadFollow, leadCatchUp:
		return phaseWait
	}
	return phaseNone // owning (the owner function traces its call), going local, ended
}

// leadSpan is the span of the lead's current phase.
type leadSpan struct {
	ph   phase
	span trace.Span
}

// enter ends the span of the phase the lead leaves and starts the one of the phase it
// enters; a parked wait's span goes on until the lead resumes. Nothing is done without
// Options.Tracer or a caller's span to parent it.
func (l *leader) enter(st leadState) {
	t := l.r.g.opts.Tracer
	// Detached, the lead is another goroutine's, which may already be running it.
	if t == nil || st == leadDetached || !l.f.call.Trace.IsValid() {
		return
	}
	ph := phaseOf(st, l.sp.ph)
	if ph == l.sp.ph {
		return
	}
	if l.sp.span != nil {
		l.endSpan()
	}
	l.sp.ph = ph
	if ph == phaseNone {
		return
	}
	ctx := trace.ContextWithSpanContext(context.Background(), l.f.call.Trace)
	_, l.sp.span = t.Start(ctx, phaseNames[ph], trace.WithSpanKind(trace.SpanKindInternal))
	if ph == phaseTakeover {
		l.sp.span.SetAttributes(attribute.String("llm_dedupe.takeover", l.reason.String()))
	}
}

// endSpan ends the current phase's span, saying what the lead learnt in it.
func (l *leader) endSpan() {
	s := l.sp.span
	if v := l.d.verdict; v != 0 {
		s.SetAttributes(attribute.String("llm_dedupe.verdict", v.String()))
	}
	if l.d.attempt > 0 {
		s.SetAttributes(attribute.Int("llm_dedupe.attempt", l.d.attempt))
	}
	s.End()
	l.sp.span = nil
}
