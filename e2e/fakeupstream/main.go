// Command fakeupstream serves the fake OpenAI API of package fakeupstream on a loopback
// address, for the end-to-end suite and the benchmarks: numbered replies, delays, failures,
// streams, and under /_fake/ its controls (behavior, release), its counters of calls and
// abandoned calls (stats, and wait, which answers when they reach given values) and the
// calls it received. With -tls-cert it serves HTTPS (HTTP/2 by ALPN, as api.openai.com
// does) with a certificate of its own, written to that file for clients to trust.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:0", "address to listen on (loopback)")
	certOut := flag.String("tls-cert", "", "serve HTTPS, and write its certificate (PEM) to this file")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: fakeupstream.New()}
	if *certOut != "" {
		cert, err := selfSigned(*certOut)
		if err != nil {
			log.Fatal(err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	// The first line of output is the address, for the process that started us.
	fmt.Fprintln(os.Stdout, ln.Addr().String())
	log.Fatal(srv.Serve(ln))
}

// selfSigned makes a certificate for 127.0.0.1 and writes it to path.
func selfSigned(path string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "fakeupstream"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(path, pemBytes, 0o644); err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
