package charttest

import (
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// The ways in: an Ingress and a Gateway API route, each letting an answer last as long as
// the longest upstream call and pass a stream on as it comes. See ADR 0073.

// upstreamTimeout is config.upstream.timeout as the proxy reads it from the rendered
// configuration.
func upstreamTimeout(t *testing.T, p *proxyParts) time.Duration {
	t.Helper()
	printed, stderr, ok := checkConfig(t, p)
	if !ok {
		t.Fatalf("the proxy refuses the configuration: %s", stderr)
	}
	s, _ := lookup(printed, "upstream.timeout").(string)
	return duration(t, "upstream.timeout", s)
}

func TestIngressLetsLongStreamsThrough(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		ing := find[networkingv1.Ingress](p.r, fullname)
		if ing == nil {
			return
		}
		svc := must[corev1.Service](t, p.r, fullname)
		for _, rule := range ing.Spec.Rules {
			if rule.Host == "" || rule.HTTP == nil || len(rule.HTTP.Paths) == 0 {
				t.Errorf("rule %+v; want a host and paths", rule)
				continue
			}
			for _, path := range rule.HTTP.Paths {
				b := path.Backend.Service
				if b == nil || b.Name != svc.Name || b.Port.Name != svc.Spec.Ports[0].Name {
					t.Errorf("path %s goes to %+v; want the Service %s, port %s", path.Path, b, svc.Name, svc.Spec.Ports[0].Name)
				}
			}
		}
		up := upstreamTimeout(t, p)
		for _, key := range []string{"nginx.ingress.kubernetes.io/proxy-read-timeout", "nginx.ingress.kubernetes.io/proxy-send-timeout"} {
			n, err := strconv.Atoi(ing.Annotations[key])
			if err != nil || time.Duration(n)*time.Second < up {
				t.Errorf("%s = %q; want at least upstream.timeout, %v", key, ing.Annotations[key], up)
			}
		}
		if got := ing.Annotations["nginx.ingress.kubernetes.io/proxy-buffering"]; got != "off" {
			t.Errorf("proxy-buffering %q; want off: a buffered stream reaches the client at its end", got)
		}
	})
}

func TestHTTPRouteLetsLongStreamsThrough(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		route := find[gatewayv1.HTTPRoute](p.r, fullname)
		if route == nil {
			return
		}
		svc := must[corev1.Service](t, p.r, fullname)
		if len(route.Spec.ParentRefs) == 0 || len(route.Spec.Rules) == 0 {
			t.Fatalf("parentRefs %v, rules %v; want both", route.Spec.ParentRefs, route.Spec.Rules)
		}
		up := upstreamTimeout(t, p)
		for _, rule := range route.Spec.Rules {
			for _, b := range rule.BackendRefs {
				if string(b.Name) != svc.Name || b.Port == nil || int32(*b.Port) != svc.Spec.Ports[0].Port {
					t.Errorf("backend %s:%v; want the Service %s:%d", b.Name, b.Port, svc.Name, svc.Spec.Ports[0].Port)
				}
			}
			if rule.Timeouts == nil || rule.Timeouts.Request == nil {
				t.Error("no request timeout: the Gateway's default (15 s with Envoy Gateway) ends long answers")
				continue
			}
			d, err := time.ParseDuration(string(*rule.Timeouts.Request))
			if err != nil || (d != 0 && d < up) {
				t.Errorf("request timeout %s; want at least upstream.timeout, %v", *rule.Timeouts.Request, up)
			}
		}
	})
}
