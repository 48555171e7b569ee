// Package proxy is the HTTP side of llm-dedupe-proxy: it passes OpenAI-compatible requests to
// the upstream model API and streams the answers back.
package proxy
