package hashing

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
)

// ErrInvalidJSON is returned (wrapped) when a body is not a JSON object; the proxy answers 400.
// The wrapping error says what is wrong and where.
var ErrInvalidJSON = errors.New("hashing: invalid JSON")

// Options configures a Hasher. The zero value scopes by credential and ignores no field.
type Options struct {
	Scope Scope
	// IgnoreFields are top-level body fields left out of the key, matched by exact name.
	// Name only fields that cannot change the answer (such as "user"); ignoring "stream" or
	// "model" would serve one kind of answer to a request that asked for another.
	IgnoreFields []string
	// SkipCanonical leaves Request.Canonical nil, for a caller that needs the key and not
	// the text it was made from (the proxy, on every request): it saves a copy of the
	// canonical body, as large as the request.
	SkipCanonical bool
}

// Hasher makes request keys. It is safe for concurrent use; the zero value is a Hasher with
// zero Options.
type Hasher struct{ opts Options }

// New returns a Hasher. It keeps its own copy of o.IgnoreFields.
func New(o Options) *Hasher {
	o.IgnoreFields = slices.Clone(o.IgnoreFields)
	return &Hasher{opts: o}
}

// Request is what Key learnt about a request, so callers need not parse the body again.
type Request struct {
	Key       string   // 64 lower-case hex digits
	Canonical []byte   // the canonical body the key was made from; nil with SkipCanonical
	Model     string   // top-level "model", if a string
	Stream    bool     // top-level "stream" is true
	Folded    []string // names of the folding rules that changed the body, in rule order
	// Temperature is top-level "temperature" if it is a number, in its canonical form
	// ("0.7", "0"), "" if it is absent, null or not a number. Seed is whether top-level
	// "seed" is present and not null. Whether a request samples is read from them.
	Temperature string
	Seed        bool
}

// Key returns the key of a request: method and path as the proxy received them (path
// without the query string), the request's header for the scope, and the raw body. An error
// wraps ErrInvalidJSON when body is not a single JSON object.
//
// Model, Stream, Temperature and Seed are read from the body as sent, before any field is
// ignored.
func (h *Hasher) Key(method, path string, header http.Header, body []byte) (Request, error) {
	return h.KeyIn(Namespace{}, method, path, header, body)
}

// Namespace separates the answers of an application (a name a client chooses) and lets an
// operator drop them all at once (a new generation). The zero value is no namespace.
type Namespace struct {
	Name string
	Gen  uint64
}

// KeyIn is Key inside namespace ns; see the package documentation.
func (h *Hasher) KeyIn(ns Namespace, method, path string, header http.Header, body []byte) (Request, error) {
	p := getParser(body)
	defer putParser(p)
	root, err := p.parse()
	if err != nil {
		return Request{}, err
	}
	var req Request
	if v, _, ok := p.get(root, "model"); ok && v.kind == kindString {
		req.Model = string(p.text(v))
	}
	if v, _, ok := p.get(root, "stream"); ok && v.kind == kindTrue {
		req.Stream = true
	}
	if v, _, ok := p.get(root, "temperature"); ok && v.kind == kindNumber {
		req.Temperature = string(p.text(v))
	}
	if v, _, ok := p.get(root, "seed"); ok && v.kind != kindNull {
		req.Seed = true
	}
	req.Folded = p.fold(root, path)

	out := h.opts.Scope.appendMaterial(p.out[:0], header, &p.scratch)
	if ns != (Namespace{}) {
		out = append(out, ";ns="...)
		out = hex.AppendEncode(out, []byte(ns.Name))
		out = append(out, ";gen="...)
		out = strconv.AppendUint(out, ns.Gen, 10)
	}
	out = append(out, 0)
	out = append(out, method...)
	out = append(out, ' ')
	out = append(out, path...)
	out = append(out, 0)
	body0 := len(out)
	out = p.writeRoot(out, root, h.opts.IgnoreFields)
	p.out = out

	sum := sha256.Sum256(out)
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	req.Key = string(hx[:])
	if !h.opts.SkipCanonical {
		req.Canonical = bytes.Clone(out[body0:])
	}
	return req, nil
}

// Canonicalize returns the canonical form of a JSON object with the ignored top-level fields
// removed. It knows no endpoint, so it applies no folding rule; Request.Canonical is the
// folded text a key is made from. An error wraps ErrInvalidJSON.
func Canonicalize(body []byte, ignore []string) ([]byte, error) {
	p := getParser(body)
	defer putParser(p)
	root, err := p.parse()
	if err != nil {
		return nil, err
	}
	p.out = p.writeRoot(p.out[:0], root, ignore)
	return bytes.Clone(p.out), nil
}

// parsers holds parser state between requests, so that a key costs a few allocations for
// its results and none for the tree.
var parsers = sync.Pool{New: func() any { return new(parser) }}

// maxPooled is the largest buffer a parser keeps when it goes back to the pool, so that one
// huge body does not pin its memory for good.
const maxPooled = 1 << 20

func getParser(body []byte) *parser {
	p := parsers.Get().(*parser)
	p.reset(body)
	return p
}

func putParser(p *parser) {
	p.src = nil
	if cap(p.buf) > maxPooled || cap(p.out) > maxPooled || cap(p.num) > maxPooled ||
		cap(p.scratch) > maxPooled ||
		(cap(p.elems)+cap(p.elemStack))*nodeSize > maxPooled ||
		(cap(p.members)+cap(p.memberStack))*2*nodeSize > maxPooled {
		return // let it go; the pool makes a fresh one
	}
	parsers.Put(p)
}
