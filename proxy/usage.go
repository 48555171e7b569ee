package proxy

import (
	"bytes"
	"encoding/json"
)

// tail keeps the end of an answer: the whole of a unary one (up to a bound), the last
// events of a stream, where the usage and the [DONE] marker are.
type tail struct {
	sse bool
	buf []byte
}

const tailMax = 64 << 10

func newTail(sse bool) *tail { return &tail{sse: sse} }

func (t *tail) add(c []byte) {
	t.buf = append(t.buf, c...)
	if len(t.buf) > tailMax && t.sse {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailMax/2:]...)
	}
}

// endsWithDone reports whether the stream's last event is "data: [DONE]".
func (t *tail) endsWithDone() bool {
	b := bytes.TrimRight(t.buf, "\r\n ")
	return bytes.HasSuffix(b, []byte("data: [DONE]")) || bytes.HasSuffix(b, []byte("data:[DONE]"))
}

// usage counts the tokens of the answer: Chat Completions, Completions and Embeddings
// report prompt_tokens and completion_tokens; the Responses API input_tokens and
// output_tokens. A stream reports them in its last data event that has usage (Chat
// Completions with stream_options.include_usage; the Responses API's response.completed).
func (t *tail) usage() (prompt, completion int64) {
	if !t.sse {
		return usageOf(t.buf)
	}
	events := bytes.Split(t.buf, []byte("\n"))
	for i := len(events) - 1; i >= 0; i-- {
		line := bytes.TrimSpace(events[i])
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
			continue
		}
		if p, c := usageOf(bytes.TrimSpace(data)); p != 0 || c != 0 {
			return p, c
		}
	}
	return 0, 0
}

type usageFields struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
}

func usageOf(b []byte) (prompt, completion int64) {
	var v struct {
		Usage    *usageFields `json:"usage"`
		Response *struct {
			Usage *usageFields `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(b, &v) != nil {
		return 0, 0
	}
	u := v.Usage
	if u == nil && v.Response != nil {
		u = v.Response.Usage
	}
	if u == nil {
		return 0, 0
	}
	return u.PromptTokens + u.InputTokens, u.CompletionTokens + u.OutputTokens
}
