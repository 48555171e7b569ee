package hashing

// writeRoot writes the top-level object in canonical form, leaving out the ignored fields.
// Members are already sorted, by the parser.
func (p *parser) writeRoot(out []byte, root node, ignore []string) []byte {
	out = append(out, '{')
	first := true
	for _, m := range p.members[root.lo:root.hi] {
		if p.ignored(m.key, ignore) {
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = p.appendString(out, m.key)
		out = append(out, ':')
		out = p.write(out, m.val)
	}
	return append(out, '}')
}

func (p *parser) ignored(key node, ignore []string) bool {
	k := p.text(key)
	for _, name := range ignore {
		if string(k) == name {
			return true
		}
	}
	return false
}

// write writes one value in canonical form. Recursion is bounded by maxDepth.
func (p *parser) write(out []byte, n node) []byte {
	switch n.kind {
	case kindNull:
		return append(out, "null"...)
	case kindFalse:
		return append(out, "false"...)
	case kindTrue:
		return append(out, "true"...)
	case kindNumber:
		return append(out, p.text(n)...)
	case kindString:
		return p.appendString(out, n)
	case kindArray:
		out = append(out, '[')
		for i, e := range p.elems[n.lo:n.hi] {
			if i > 0 {
				out = append(out, ',')
			}
			out = p.write(out, e)
		}
		return append(out, ']')
	default: // kindObject
		out = append(out, '{')
		for i, m := range p.members[n.lo:n.hi] {
			if i > 0 {
				out = append(out, ',')
			}
			out = p.appendString(out, m.key)
			out = append(out, ':')
			out = p.write(out, m.val)
		}
		return append(out, '}')
	}
}

// get finds the member named key in an object node, returning its value and its index in
// p.members (so that a folding rule can replace the value).
func (p *parser) get(obj node, key string) (node, int, bool) {
	if obj.kind != kindObject {
		return node{}, 0, false
	}
	// Members are sorted; objects in requests are small, so a linear scan is as good as
	// a binary search and simpler.
	for i := obj.lo; i < obj.hi; i++ {
		if string(p.text(p.members[i].key)) == key {
			return p.members[i].val, i, true
		}
	}
	return node{}, 0, false
}

// isString reports whether n is a string whose decoded text is s.
func (p *parser) isString(n node, s string) bool {
	return n.kind == kindString && string(p.text(n)) == s
}
