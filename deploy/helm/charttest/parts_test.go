package charttest

import (
	"net"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The parts of a rendered release the tests read, and their helpers.

// proxyConfig is the part of the rendered config.yaml the invariants read.
type proxyConfig struct {
	Listen   string `json:"listen"`
	Upstream struct {
		APIKey string `json:"api_key"`
	} `json:"upstream"`
	Redis struct {
		Addrs      []string `json:"addrs"`
		MasterName string   `json:"master_name"`
		Password   string   `json:"password"`
		TLS        bool     `json:"tls"`
		TLSCAFile  string   `json:"tls_ca_file"`
	} `json:"redis"`
	Admin struct {
		Listen string `json:"listen"`
		Token  string `json:"token"`
	} `json:"admin"`
	ShutdownDelay   string `json:"shutdown_delay"`
	ShutdownTimeout string `json:"shutdown_timeout"`
}

// proxyParts are the objects of a release that make up the proxy.
type proxyParts struct {
	r         *release
	dep       *appsv1.Deployment
	pod       *corev1.PodSpec
	container *corev1.Container
	cm        *corev1.ConfigMap
	cfgText   string
	cfg       proxyConfig
}

func proxyOf(t *testing.T, r *release) *proxyParts {
	t.Helper()
	p := &proxyParts{r: r, dep: must[appsv1.Deployment](t, r, fullname)}
	p.pod = &p.dep.Spec.Template.Spec
	for i := range p.pod.Containers {
		if p.pod.Containers[i].Name == "proxy" {
			p.container = &p.pod.Containers[i]
		}
	}
	if p.container == nil {
		t.Fatal("the Deployment has no container named proxy")
	}
	p.cm = must[corev1.ConfigMap](t, r, fullname)
	p.cfgText = p.cm.Data["config.yaml"]
	// Not strict: proxyConfig holds only what the invariants read; the proxy's own check
	// (TestRenderedConfigPassesTheProxysCheck) refuses unknown keys.
	if err := yaml.Unmarshal([]byte(p.cfgText), &p.cfg); err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	return p
}

// podLabels are the labels of the proxy's pods.
func (p *proxyParts) podLabels() labels.Set { return p.dep.Spec.Template.Labels }

func selects(t *testing.T, sel *metav1.LabelSelector, set labels.Set) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return !s.Empty() && s.Matches(set)
}

// containerPort returns the port of the container named name, or 0.
func containerPort(c *corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func listenPort(t *testing.T, key, addr string) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil {
		t.Fatalf("config %s = %q: not host:port", key, addr)
	}
	return int32(n)
}

func duration(t *testing.T, key, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("config %s = %q: %v", key, s, err)
	}
	return d
}

func forEachSet(t *testing.T, check func(t *testing.T, p *proxyParts)) {
	for _, set := range valueSets {
		t.Run(set, func(t *testing.T) { check(t, proxyOf(t, renderSet(t, set))) })
	}
}
