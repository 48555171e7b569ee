package hashing

import "strings"

// A rule folds one spelling of a request body into another that the API defines to mean
// the same, so that both get one key. A rule must fire only where the meaning is certainly
// identical: a wrong fold serves one request's answer to a different request, while a
// missing fold only costs a cache miss.
type rule struct {
	name   string
	suffix string // the rule applies to paths ending in suffix
	// fold rewrites the parsed body in place and reports whether it changed anything.
	fold func(p *parser, root node) bool
}

// rules are applied in this order; each is documented in the package comment.
var rules = []rule{
	{
		// A chat message's content given as [{"type":"text","text":S}] is the content S.
		// Only a single text part with no other field is folded: two parts stay two parts
		// (the API keeps them separate), and a part with extra fields (a cache hint, say) is
		// not the plain string. One cost, accepted: an upstream that refuses parts arrays
		// for some model or role answers 400 to one spelling only, and that 400 reaches the
		// followers of the same flight (it is not cached).
		name:   "chat-content-single-text-part",
		suffix: "/chat/completions",
		fold:   foldChatContent,
	},
	{
		// The Responses API reference defines a string input as "equivalent to a text input
		// with the user role", so [{"role":"user","content":S}] is the input S. Nothing else
		// is folded: not "type":"message", not input_text parts, not other roles.
		name:   "responses-input-single-user-message",
		suffix: "/responses",
		fold:   foldResponsesInput,
	},
}

// fold applies the rules that match path and returns the names of those that changed the
// body (nil if none did, which is the common case and costs nothing).
func (p *parser) fold(root node, path string) []string {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	var fired []string
	for _, r := range rules {
		if strings.HasSuffix(path, r.suffix) && r.fold(p, root) {
			fired = append(fired, r.name)
		}
	}
	return fired
}

func foldChatContent(p *parser, root node) bool {
	msgs, _, ok := p.get(root, "messages")
	if !ok || msgs.kind != kindArray {
		return false
	}
	changed := false
	for _, msg := range p.elems[msgs.lo:msgs.hi] {
		content, at, ok := p.get(msg, "content")
		if !ok || content.kind != kindArray || content.hi-content.lo != 1 {
			continue
		}
		if text, ok := p.singleTextPart(p.elems[content.lo]); ok {
			p.members[at].val = text
			changed = true
		}
	}
	return changed
}

// singleTextPart returns S if part is exactly {"type":"text","text":S} with S a string.
func (p *parser) singleTextPart(part node) (node, bool) {
	if part.kind != kindObject || part.hi-part.lo != 2 {
		return node{}, false
	}
	text, typ := p.members[part.lo], p.members[part.lo+1] // sorted: "text" < "type"
	if !p.isString(text.key, "text") || text.val.kind != kindString ||
		!p.isString(typ.key, "type") || !p.isString(typ.val, "text") {
		return node{}, false
	}
	return text.val, true
}

func foldResponsesInput(p *parser, root node) bool {
	input, at, ok := p.get(root, "input")
	if !ok || input.kind != kindArray || input.hi-input.lo != 1 {
		return false
	}
	item := p.elems[input.lo]
	if item.kind != kindObject || item.hi-item.lo != 2 {
		return false
	}
	content, role := p.members[item.lo], p.members[item.lo+1] // sorted: "content" < "role"
	if !p.isString(content.key, "content") || content.val.kind != kindString ||
		!p.isString(role.key, "role") || !p.isString(role.val, "user") {
		return false
	}
	p.members[at].val = content.val
	return true
}
