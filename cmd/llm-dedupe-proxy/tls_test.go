package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"
)

// TestRedisTLSCAFile: redis.tls_ca_file trusts a private CA for Redis; a file that is
// missing or holds no certificate stops start-up with a message naming the key.
func TestRedisTLSCAFile(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "private test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := writeFile(t, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))

	cfg, err := redisTLS(RedisConfig{TLS: true, TLSCAFile: ca})
	if err != nil || cfg == nil || cfg.RootCAs == nil {
		t.Fatalf("redisTLS with a CA file: %v, %v; want a config trusting it", cfg, err)
	}
	if cfg, err := redisTLS(RedisConfig{TLS: true}); err != nil || cfg.RootCAs != nil {
		t.Errorf("redisTLS without a CA file: %v, %v; want the system roots (RootCAs nil)", cfg, err)
	}
	if cfg, err := redisTLS(RedisConfig{}); err != nil || cfg != nil {
		t.Errorf("redisTLS without TLS: %v, %v; want nil", cfg, err)
	}
	for _, path := range []string{"/nonexistent/ca.pem", writeFile(t, "junk.pem", "not a certificate")} {
		r := runCmd(t, nil, "", "serve", "--listen=127.0.0.1:0", "--redis.addrs=127.0.0.1:1", "--redis.tls=true", "--redis.tls_ca_file="+path)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "llm-dedupe-proxy: invalid config: redis.tls_ca_file: ") {
			t.Errorf("serve with CA file %s: status %d, stderr %q; want 2 and a configuration error naming redis.tls_ca_file", path, r.code, r.stderr)
		}
	}
}
