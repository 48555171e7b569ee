package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
)

// sdkClient is the official Go SDK pointed at one proxy instance, with no retries of its
// own (a retry would hide a failed answer) and a bounded wait.
func sdkClient(in *instance) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(in.URL+"/v1/"),
		option.WithAPIKey(apiKeyA),
		option.WithMaxRetries(0),
		option.WithHTTPClient(client),
		option.WithRequestTimeout(clientTimeout),
	)
}

// concurrently runs fn once per instance-client pair, n in all, and waits for them.
func concurrently(ins []*instance, n int, fn func(i int, in *instance)) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { fn(i, ins[i%len(ins)]) })
	}
	return &wg
}

// TestGoSDK: the official Go SDK, through three instances, sees exactly what the upstream
// sent — ids, content, usage — for chat, streamed chat and embeddings, and concurrent
// duplicates come back identical from one upstream call each.
func TestGoSDK(t *testing.T) {
	const n = 6 // concurrent identical SDK calls per kind, two per instance
	ctx := context.Background()
	model := "e2e-go-sdk"

	t.Run("chat", func(t *testing.T) {
		c := startCluster(t, clusterOpts{}) // each its own: helpers fail the test that owns the processes
		c.fake.set(fakeupstream.Behavior{Hold: true})
		before := c.fake.stats().Calls
		got := make([]*openai.ChatCompletion, n)
		errs := make([]error, n)
		hdrs := make([]*http.Response, n)
		wg := concurrently(c.ins, n, func(i int, in *instance) {
			cl := sdkClient(in)
			got[i], errs[i] = cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:    model,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hi from the Go SDK")},
			}, option.WithResponseInto(&hdrs[i]))
		})
		waitWaiting(t, c.ins, n)
		c.fake.release()
		wg.Wait()
		call := before + 1
		want := fakeupstream.Unary(chatPath, call, model)
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("SDK call %d: %v", i, errs[i])
			}
			r := got[i]
			if r.RawJSON() != want {
				t.Errorf("SDK call %d saw %s; want exactly %s", i, r.RawJSON(), want)
			}
			if r.ID != fmt.Sprintf("chatcmpl-%d", call) || r.Choices[0].Message.Content != fmt.Sprintf("reply %d", call) ||
				r.Usage.PromptTokens != 11 || r.Usage.CompletionTokens != 7 || r.Usage.TotalTokens != 18 || r.Model != model {
				t.Errorf("SDK call %d: id %q content %q usage %+v model %q; want call %d's", i, r.ID, r.Choices[0].Message.Content, r.Usage, r.Model, call)
			}
			if id := hdrs[i].Header.Get("X-Request-Id"); id != fmt.Sprintf("req_%d", call) {
				t.Errorf("SDK call %d: X-Request-Id %q; want req_%d", i, id, call)
			}
		}
		if calls := c.fake.stats().Calls - before; calls != 1 {
			t.Errorf("%d upstream calls for %d identical SDK calls; want 1", calls, n)
		}
	})

	t.Run("streaming chat", func(t *testing.T) {
		c := startCluster(t, clusterOpts{}) // each its own: helpers fail the test that owns the processes
		const chunks = 4
		c.fake.set(fakeupstream.Behavior{Hold: true, Chunks: chunks})
		before := c.fake.stats().Calls
		type result struct {
			raw     []string // each chunk as the SDK decoded it, raw
			content string
			usage   openai.CompletionUsage
			id      string
			err     error
		}
		got := make([]result, n)
		var firsts sync.WaitGroup // each stream has its first chunk (or has ended)
		firsts.Add(n)
		wg := concurrently(c.ins, n, func(i int, in *instance) {
			cl := sdkClient(in)
			s := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
				Model:         model,
				Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Stream hi from the Go SDK")},
				StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
			})
			defer s.Close()
			var acc openai.ChatCompletionAccumulator
			var once sync.Once
			defer once.Do(firsts.Done)
			for s.Next() {
				once.Do(firsts.Done)
				ch := s.Current()
				got[i].raw = append(got[i].raw, ch.RawJSON())
				acc.AddChunk(ch)
			}
			got[i].err = s.Err()
			got[i].id, got[i].usage = acc.ID, acc.Usage
			if len(acc.Choices) > 0 {
				got[i].content = acc.Choices[0].Message.Content
			}
		})
		// The upstream holds the last chunk: every SDK stream gets its first ones live,
		// then the stream may end.
		waitGroup(t, &firsts, 10*time.Second, "every SDK stream's first chunk")
		if s := c.fake.stats(); s.Calls-before != 1 || s.Completed != before {
			t.Errorf("upstream %+v when every stream had its first chunk; want 1 more call, still open", s)
		}
		c.fake.release()
		wg.Wait()
		call := before + 1
		var want []string // the data of every event but [DONE]
		for _, ev := range fakeupstream.StreamEvents(chatPath, call, model, chunks, true) {
			if d := strings.TrimSuffix(strings.TrimPrefix(ev.Text, "data: "), "\n\n"); d != "[DONE]" {
				want = append(want, d)
			}
		}
		for i, r := range got {
			if r.err != nil {
				t.Fatalf("SDK stream %d: %v", i, r.err)
			}
			if !slices.Equal(r.raw, want) {
				t.Errorf("SDK stream %d chunks\n%q\nwant exactly\n%q", i, r.raw, want)
			}
			if r.id != fmt.Sprintf("chatcmpl-%d", call) || r.content != "tok0 tok1 tok2 tok3 " ||
				r.usage.PromptTokens != 11 || r.usage.CompletionTokens != chunks || r.usage.TotalTokens != 11+chunks {
				t.Errorf("SDK stream %d: id %q content %q usage %+v; want call %d's", i, r.id, r.content, r.usage, call)
			}
		}
		if calls := c.fake.stats().Calls - before; calls != 1 {
			t.Errorf("%d upstream calls for %d identical SDK streams; want 1", calls, n)
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		c := startCluster(t, clusterOpts{}) // each its own: helpers fail the test that owns the processes
		c.fake.set(fakeupstream.Behavior{Hold: true})
		before := c.fake.stats().Calls
		got := make([]*openai.CreateEmbeddingResponse, n)
		errs := make([]error, n)
		wg := concurrently(c.ins, n, func(i int, in *instance) {
			cl := sdkClient(in)
			got[i], errs[i] = cl.Embeddings.New(ctx, openai.EmbeddingNewParams{
				Model:          model,
				Input:          openai.EmbeddingNewParamsInputUnion{OfString: openai.String("embed me")},
				EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat,
			})
		})
		waitWaiting(t, c.ins, n)
		c.fake.release()
		wg.Wait()
		call := before + 1
		want := fakeupstream.Unary(embedPath, call, model)
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("SDK embedding %d: %v", i, errs[i])
			}
			r := got[i]
			if r.RawJSON() != want {
				t.Errorf("SDK embedding %d saw %s; want exactly %s", i, r.RawJSON(), want)
			}
			if len(r.Data) != 1 || !slices.Equal(r.Data[0].Embedding, []float64{float64(call), 0.5, -0.25}) || r.Usage.PromptTokens != 5 {
				t.Errorf("SDK embedding %d: data %+v usage %+v; want call %d's vector and 5 tokens", i, r.Data, r.Usage, call)
			}
		}
		if calls := c.fake.stats().Calls - before; calls != 1 {
			t.Errorf("%d upstream calls for %d identical SDK embeddings; want 1", calls, n)
		}
	})
}

// waitGroup waits for wg, failing the test after d.
func waitGroup(t testing.TB, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}
