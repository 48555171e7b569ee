package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// nginxLocation is the usual way to put nginx's cache in front of an OpenAI-compatible API:
// POST cached with the body (and the credential) in the key, one upstream call per key at a
// time with proxy_cache_lock. It is printed in BENCHMARKS.md as it was run.
//
// Set-Cookie is ignored and hidden because nginx caches nothing that sets a cookie and the
// real API (like the fake one) sends cookies; the upstream's Cache-Control is obeyed, so a
// stream sent with "Cache-Control: no-cache" is not stored, as with the real API.
const nginxLocation = `    location /v1/ {
        proxy_pass http://upstream_api;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_read_timeout 600s;

        proxy_cache llm;
        proxy_cache_methods POST;
        proxy_cache_key "$request_method$request_uri|$http_authorization|$request_body";
        proxy_cache_valid 200 10m;
        proxy_cache_lock on;
        proxy_cache_lock_timeout 5s;   # the default, written out
        proxy_cache_lock_age 5s;       # the default, written out
        proxy_ignore_headers Set-Cookie;
        proxy_hide_header Set-Cookie;
        add_header X-Cache-Status $upstream_cache_status always;
    }`

// nginxConf is a whole configuration of one instance with its own cache in dir.
func nginxConf(dir, listen, upstreamHostPort string) string {
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;" // the cache and temp directories are the harness's
	}
	return fmt.Sprintf(`%s
daemon off;
worker_processes auto;
worker_rlimit_nofile 65536;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 16384; }
http {
    access_log off;
    client_body_temp_path %[2]s/body;
    proxy_temp_path %[2]s/proxy;
    fastcgi_temp_path %[2]s/fastcgi;
    uwsgi_temp_path %[2]s/uwsgi;
    scgi_temp_path %[2]s/scgi;
    # $request_body is empty when the body was spooled to a file: keep bodies in memory.
    client_max_body_size 10m;
    client_body_buffer_size 10m;
    proxy_cache_path %[2]s/cache levels=1:2 keys_zone=llm:16m max_size=1g inactive=10m use_temp_path=off;
    upstream upstream_api { server %[3]s; keepalive 256; }
    server {
        listen %[4]s;
        location = /healthz { return 200 "ok\n"; }
%[5]s
    }
}
`, user, dir, upstreamHostPort, listen, nginxLocation)
}

// startNginx runs one nginx instance in the foreground with its own cache directory.
func startNginx(ctx context.Context, ps *procs, dir, name, upstream string) (*proc, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, "", err
	}
	ndir := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Join(ndir, "cache"), 0o755); err != nil {
		return nil, "", err
	}
	conf := filepath.Join(ndir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(nginxConf(ndir, loopback(port), u.Host)), 0o644); err != nil {
		return nil, "", err
	}
	bin, err := nginxBin()
	if err != nil {
		return nil, "", err
	}
	p, err := ps.start(name, dir, nil, bin, "-p", ndir, "-c", conf, "-e", filepath.Join(ndir, "error.log"))
	if err != nil {
		return nil, "", err
	}
	base := "http://" + loopback(port)
	if err := waitHTTP(ctx, p, base+"/healthz"); err != nil {
		errLog, _ := os.ReadFile(filepath.Join(ndir, "error.log"))
		return nil, "", fmt.Errorf("%w\n%s", err, errLog)
	}
	return p, base, nil
}

// nginxBin finds nginx on PATH or where Debian puts it (/usr/sbin is not on every PATH).
func nginxBin() (string, error) {
	if bin, err := exec.LookPath("nginx"); err == nil {
		return bin, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", fmt.Errorf("nginx not found: run bench/ensure-deps.sh (or -nginx=false)")
}

func nginxVersion() string {
	bin, err := nginxBin()
	if err != nil {
		return "not installed"
	}
	out, err := exec.Command(bin, "-v").CombinedOutput()
	if err != nil {
		return "not installed"
	}
	return strings.TrimPrefix(strings.TrimSpace(string(out)), "nginx version: ")
}
