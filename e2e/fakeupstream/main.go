// Command fakeupstream serves the fake OpenAI API of package fakeupstream on a loopback
// address, for the end-to-end suite and the benchmarks: numbered replies, delays, failures,
// streams, and under /_fake/ its controls (behavior, release), its counters of calls and
// abandoned calls (stats, and wait, which answers when they reach given values) and the
// calls it received.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:0", "address to listen on (loopback)")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	// The first line of output is the address, for the process that started us.
	fmt.Fprintln(os.Stdout, ln.Addr().String())
	log.Fatal(http.Serve(ln, fakeupstream.New()))
}
