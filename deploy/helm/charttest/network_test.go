package charttest

import (
	"slices"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Who reaches the pods: the Services, the NetworkPolicy, the ServiceMonitor. Every test
// checks every value set.

// TestServicesExposeWhatTheValuesSay: the clients' Service exposes the API port only; the
// admin port has a Service of its own, only with the admin API on.
func TestServicesExposeWhatTheValuesSay(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		api := must[corev1.Service](t, p.r, fullname)
		if !selects(t, &metav1.LabelSelector{MatchLabels: api.Spec.Selector}, p.podLabels()) {
			t.Error("the Service does not select the proxy's pods")
		}
		if len(api.Spec.Ports) != 1 || api.Spec.Ports[0].TargetPort != intstr.FromString("http") {
			t.Errorf("Service ports %+v; want the http port alone", api.Spec.Ports)
		}
		admin := find[corev1.Service](p.r, fullname+"-admin")
		hasAdmin := containerPort(p.container, "admin") != 0
		switch {
		case hasAdmin != (admin != nil):
			t.Errorf("admin port %v, admin Service %v", hasAdmin, admin != nil)
		case admin != nil:
			if len(admin.Spec.Ports) != 1 || admin.Spec.Ports[0].TargetPort != intstr.FromString("admin") {
				t.Errorf("admin Service ports %+v; want the admin port alone", admin.Spec.Ports)
			}
			if admin.Spec.Type != corev1.ServiceTypeClusterIP {
				t.Errorf("admin Service type %s; want ClusterIP", admin.Spec.Type)
			}
		}
	})
}

// TestNetworkPolicyOpensOnlyTheNamedPorts: every rule names its ports (a rule without ports
// opens them all), and the admin port is only reachable from the peers the values name.
func TestNetworkPolicyOpensOnlyTheNamedPorts(t *testing.T) {
	forEachSet(t, checkNetworkPolicy)
	t.Run("admin API on, no peer named", func(t *testing.T) {
		vals := readValues(t, "existing-secret")
		vals["networkPolicy"] = map[string]any{"enabled": true, "api": map[string]any{"from": []any{map[string]any{"podSelector": map[string]any{}}}}}
		p := proxyOf(t, newRelease(t, "admin-closed", vals))
		must[networkingv1.NetworkPolicy](t, p.r, fullname)
		checkNetworkPolicy(t, p)
	})
}

func checkNetworkPolicy(t *testing.T, p *proxyParts) {
	t.Helper()
	np := find[networkingv1.NetworkPolicy](p.r, fullname)
	if np == nil {
		return
	}
	if !selects(t, &np.Spec.PodSelector, p.podLabels()) {
		t.Error("the NetworkPolicy does not select the proxy's pods")
	}
	var http, testPod bool
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) == 0 {
			t.Error("an ingress rule without ports opens every port")
		}
		for _, port := range rule.Ports {
			switch port.Port.String() {
			case "http":
				http = true
				if len(rule.From) == 0 {
					t.Error("the http port is open to every pod of the cluster")
				}
				for _, peer := range rule.From {
					if peer.PodSelector != nil && peer.NamespaceSelector == nil && selects(t, peer.PodSelector, testPodLabels(t, p)) {
						testPod = true
					}
				}
			case "admin":
				if len(rule.From) == 0 {
					t.Error("the admin port is open to everyone")
				}
			default:
				t.Errorf("unexpected port %s", port.Port.String())
			}
		}
	}
	if !http {
		t.Error("the http port is closed: clients and Prometheus could not reach it")
	}
	if test := find[corev1.Pod](p.r, fullname+"-test"); test != nil && !testPod {
		t.Error("the `helm test` pod cannot reach the http port")
	}
	checkEgress(t, p, np)
	if redis := find[networkingv1.NetworkPolicy](p.r, fullname+"-redis"); redis != nil {
		if len(redis.Spec.Ingress) != 1 || len(redis.Spec.Ingress[0].From) != 1 ||
			!selects(t, redis.Spec.Ingress[0].From[0].PodSelector, p.podLabels()) {
			t.Error("the in-chart Redis is open to more than the proxy's pods")
		}
	} else if find[appsv1.Deployment](p.r, fullname+"-redis") != nil {
		t.Error("the in-chart Redis has no NetworkPolicy while the proxy has one")
	}
}

// TestServiceMonitorScrapesTheAPIService: it selects the clients' Service, whose port it
// names, and not the admin one.
func TestServiceMonitorScrapesTheAPIService(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		sm := find[monitoringv1.ServiceMonitor](p.r, fullname)
		if sm == nil {
			return
		}
		var selected []string
		for _, svc := range all[corev1.Service](p.r) {
			if selects(t, &sm.Spec.Selector, svc.Labels) {
				selected = append(selected, svc.Name)
			}
		}
		if len(selected) != 1 || selected[0] != fullname {
			t.Errorf("the ServiceMonitor selects %q; want [%s]", selected, fullname)
		}
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("endpoints %+v; want /metrics on port http", sm.Spec.Endpoints)
		}
		if ns := sm.Spec.NamespaceSelector.MatchNames; len(ns) != 1 || ns[0] != namespace {
			t.Errorf("namespaces %q; want [%s]", ns, namespace)
		}
		var node bool
		for _, rl := range sm.Spec.Endpoints[0].RelabelConfigs {
			node = node || (rl.TargetLabel == "node" && slices.Contains(rl.SourceLabels, "__meta_kubernetes_pod_node_name"))
		}
		if !node {
			t.Error("the series are not labelled with their node")
		}
	})
}

func testPodLabels(t *testing.T, p *proxyParts) map[string]string {
	t.Helper()
	if test := find[corev1.Pod](p.r, fullname+"-test"); test != nil {
		return test.Labels
	}
	return map[string]string{}
}

// checkEgress: with egress restricted, the pods may still resolve names and reach the
// in-chart Redis, and every rule names its ports.
func checkEgress(t *testing.T, p *proxyParts, np *networkingv1.NetworkPolicy) {
	t.Helper()
	var egress bool
	for _, pt := range np.Spec.PolicyTypes {
		egress = egress || pt == networkingv1.PolicyTypeEgress
	}
	if !egress {
		if len(np.Spec.Egress) != 0 {
			t.Error("egress rules without the Egress policy type")
		}
		return
	}
	var dns, redis bool
	redisDep := find[appsv1.Deployment](p.r, fullname+"-redis")
	for _, rule := range np.Spec.Egress {
		if len(rule.Ports) == 0 {
			t.Error("an egress rule without ports opens every port")
		}
		for _, port := range rule.Ports {
			if port.Port != nil && port.Port.IntValue() == 53 {
				dns = true
			}
			if redisDep != nil && port.Port != nil && port.Port.IntValue() == 6379 {
				for _, peer := range rule.To {
					redis = redis || (peer.PodSelector != nil && selects(t, peer.PodSelector, redisDep.Spec.Template.Labels))
				}
			}
		}
	}
	if !dns {
		t.Error("egress denies DNS: the pods could resolve neither Redis nor the upstream")
	}
	if redisDep != nil && !redis {
		t.Error("egress denies the in-chart Redis")
	}
}
