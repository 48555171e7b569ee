package singleflight

// serveHit ends f with the stored answer d found, and keeps it in this process. A follower
// of the attempt that stored it finishes that answer where its readers are (ADR 0006).
func (r *remote) serveHit(f *flight, d decision, pos *position) {
	d.head = r.g.keepFor(f.key, d.head, d.body, d.age, d.ttl) // annotated: its readers need not parse it
	if pos.token != "" {
		// Some callers may have joined after the answer landed (ADR 0021).
		f.setLanded(d.landed)
	}
	switch {
	case pos.token == "":
		f.finishHit(d.head, d.body, d.age)
	case d.token != pos.token || !f.continueWith(d.head, d.body):
		f.finishWith(d.head, d.body)
	}
}
