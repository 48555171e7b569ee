package proxy

import (
	"bytes"
	"encoding/json"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// tail keeps the end of an answer, where the usage and the end markers are: references
// to the chunks (which are never changed), not copies. A stream keeps its last tailMax
// bytes or more, in whole chunks. See ADR 0034.
type tail struct {
	sse    bool
	chunks [][]byte
	size   int
}

const tailMax = 64 << 10

func newTail(sse bool) *tail { return &tail{sse: sse} }

func (t *tail) add(c []byte) {
	t.chunks = append(t.chunks, c)
	t.size += len(c)
	for t.sse && len(t.chunks) > 1 && t.size-len(t.chunks[0]) >= tailMax {
		t.size -= len(t.chunks[0])
		t.chunks = t.chunks[1:]
	}
}

func (t *tail) bytes() []byte {
	if len(t.chunks) == 1 {
		return t.chunks[0]
	}
	return bytes.Join(t.chunks, nil)
}

// endsWithDone reports whether the stream's last event is "data: [DONE]".
func (t *tail) endsWithDone() bool {
	b := bytes.TrimRight(t.bytes(), "\r\n ")
	return bytes.HasSuffix(b, []byte("data: [DONE]")) || bytes.HasSuffix(b, []byte("data:[DONE]"))
}

// lastEvent is the name (the "event:" field) of the stream's last event.
func (t *tail) lastEvent() string {
	b := bytes.TrimRight(t.bytes(), "\r\n ")
	if i := bytes.LastIndex(b, []byte("\n\n")); i >= 0 {
		b = b[i+2:]
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if name, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("event:")); ok {
			return string(bytes.TrimSpace(name))
		}
	}
	return ""
}

// usage counts the tokens of the answer: Chat Completions, Completions and Embeddings
// report prompt_tokens and completion_tokens; the Responses API input_tokens and
// output_tokens. The last "usage" object of the answer is read, wherever it is: at the end
// of a unary body, in the last data event of a Chat Completions stream with
// stream_options.include_usage, in the Responses API's response.completed event. Only that
// object is decoded, not the whole answer.
func (t *tail) usage() (prompt, completion int64) { return usageOf(t.bytes()) }

// usageNote is the token usage of a stored answer, read once when the answer is kept (see
// AnnotateUsage) rather than on each of its hits.
type usageNote struct{ prompt, completion int64 }

// AnnotateUsage is the singleflight.Options.Annotate the proxy's Flights should be given:
// it reads the token usage of each answer kept in the process once, for its hits to count
// their saved tokens with. Without it, a hit reads the usage from the bytes it was sent.
func AnnotateUsage(_ singleflight.Head, body []byte) any {
	p, c := usageOf(body)
	return usageNote{prompt: p, completion: c}
}

// usageOf is the token usage of an answer, or of its end; see tail.usage.
func usageOf(b []byte) (prompt, completion int64) {
	var u usageFields
	if !decodeMember(b, bytes.LastIndex(b, []byte(`"usage"`)), `"usage"`, &u) {
		return 0, 0
	}
	return u.PromptTokens + u.InputTokens, u.CompletionTokens + u.OutputTokens
}

// decodeMember decodes into v the value of the member whose quoted name key starts at b[i]
// (i < 0: none found), without decoding anything else of b.
func decodeMember(b []byte, i int, key string, v any) bool {
	if i < 0 {
		return false
	}
	rest := bytes.TrimLeft(b[i+len(key):], " \t\r\n")
	rest, ok := bytes.CutPrefix(rest, []byte(":"))
	return ok && json.NewDecoder(bytes.NewReader(rest)).Decode(v) == nil
}

type usageFields struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
}
