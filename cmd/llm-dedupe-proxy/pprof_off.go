//go:build !pprof

package main

import "log/slog"

// startPprof does nothing: only a binary built with -tags pprof serves profiles (pprof.go).
func startPprof(*app, *slog.Logger) (stop func()) { return func() {} }
