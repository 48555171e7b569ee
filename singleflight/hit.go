package singleflight

// serveHit ends f with the stored answer d found, and keeps it in this process. A flight
// that was following the attempt that stored it finishes that same answer: its readers go
// on from where they are. One that followed another attempt gives that generation up for
// it; one that followed nothing is a hit.
func (r *remote) serveHit(f *flight, d decision, pos *position) {
	d.head = r.g.keepFor(f.key, d.head, d.body, d.age, d.ttl) // annotated: its readers need not parse it
	if pos.token != "" {
		// Its callers joined a flight in progress, some maybe after that answer landed:
		// the same fence as the done entry's.
		f.fence(d.landed)
	}
	switch {
	case pos.token == "":
		f.finishHit(d.head, d.body, d.age)
	case d.token != pos.token || !f.continueWith(d.head, d.body):
		f.finishWith(d.head, d.body)
	}
}
