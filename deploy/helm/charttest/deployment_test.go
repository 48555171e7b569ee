package charttest

import (
	"path"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The Deployment, its pods and what they read. Every test checks every value set.

func TestDeploymentRunsSpreadReplicas(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		hpa := find[autoscalingv2.HorizontalPodAutoscaler](p.r, fullname)
		switch {
		case hpa != nil && p.dep.Spec.Replicas != nil:
			t.Errorf("replicas = %d with a HorizontalPodAutoscaler; want it unset (the autoscaler owns it)", *p.dep.Spec.Replicas)
		case hpa == nil && p.dep.Spec.Replicas == nil:
			t.Error("replicas unset without a HorizontalPodAutoscaler")
		case p.r.set == "defaults" && *p.dep.Spec.Replicas != 3:
			t.Errorf("replicas = %d by default; want 3", *p.dep.Spec.Replicas)
		}
		if hpa != nil {
			if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != p.dep.Name || ref.APIVersion != "apps/v1" {
				t.Errorf("HorizontalPodAutoscaler scales %+v; want the Deployment %s", ref, p.dep.Name)
			}
			if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 || *hpa.Spec.MinReplicas > hpa.Spec.MaxReplicas {
				t.Errorf("HorizontalPodAutoscaler min %v, max %d; want 2 ≤ min ≤ max", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
			}
		}
		if !selects(t, p.dep.Spec.Selector, p.podLabels()) {
			t.Error("the Deployment's selector does not match its pods")
		}
		var spread bool
		for _, c := range p.pod.TopologySpreadConstraints {
			if c.TopologyKey == "kubernetes.io/hostname" && c.MaxSkew == 1 && selects(t, c.LabelSelector, p.podLabels()) {
				spread = true
			}
		}
		if !spread {
			t.Error("no topology spread constraint over kubernetes.io/hostname selecting the proxy's pods")
		}
		ru := p.dep.Spec.Strategy.RollingUpdate
		if p.dep.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil ||
			ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge == nil || ru.MaxSurge.IntValue() < 1 {
			t.Errorf("strategy %+v; want a rolling update that starts a pod before it stops one (maxUnavailable 0)", p.dep.Spec.Strategy)
		}
	})
}

func TestProbesAskTheProxysEndpoints(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		c := p.container
		for _, tc := range []struct {
			name  string
			probe *corev1.Probe
			path  string
		}{
			{"readiness", c.ReadinessProbe, "/readyz"},
			{"liveness", c.LivenessProbe, "/healthz"},
			{"startup", c.StartupProbe, "/healthz"},
		} {
			if tc.probe == nil || tc.probe.HTTPGet == nil {
				t.Errorf("%s probe: none, or not HTTP", tc.name)
				continue
			}
			if tc.probe.HTTPGet.Path != tc.path || tc.probe.HTTPGet.Port != intstr.FromString("http") {
				t.Errorf("%s probe asks %s on %s; want %s on the http port", tc.name, tc.probe.HTTPGet.Path, tc.probe.HTTPGet.Port.String(), tc.path)
			}
		}
		if containerPort(c, "http") == 0 {
			t.Error("the container has no port named http")
		}
	})
}

// TestShutdownLosesNoRequest: the instance drains for shutdown_delay, at least as long as the
// readiness probe takes to fail, and the kubelet waits for the drain, the requests in
// progress and the handover before it kills.
func TestShutdownLosesNoRequest(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		delay := duration(t, "shutdown_delay", p.cfg.ShutdownDelay)
		timeout := duration(t, "shutdown_timeout", p.cfg.ShutdownTimeout)
		rp := p.container.ReadinessProbe
		if seen := time.Duration(rp.PeriodSeconds*rp.FailureThreshold) * time.Second; delay < seen || delay <= 0 {
			t.Errorf("shutdown_delay %s; want at least the readiness probe's period × failures, %s", delay, seen)
		}
		grace := p.pod.TerminationGracePeriodSeconds
		if floor := delay + timeout + 5*time.Second; grace == nil || time.Duration(*grace)*time.Second < floor {
			t.Errorf("terminationGracePeriodSeconds %v; want at least shutdown_delay + shutdown_timeout + 5s = %s", grace, floor)
		}
		if p.container.Lifecycle != nil && p.container.Lifecycle.PreStop != nil {
			t.Error("a preStop hook delays SIGTERM beyond what the grace period was computed for")
		}
	})
}

func TestPodsRunUnprivilegedWithoutToken(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		pods := map[string]*corev1.PodSpec{"proxy": p.pod}
		if redis := find[appsv1.Deployment](p.r, fullname+"-redis"); redis != nil {
			pods["redis"] = &redis.Spec.Template.Spec
		}
		if test := find[corev1.Pod](p.r, fullname+"-test"); test != nil {
			pods["helm test"] = &test.Spec
		}
		for name, pod := range pods {
			if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
				t.Errorf("%s: automountServiceAccountToken is not false", name)
			}
			psc := pod.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
				t.Errorf("%s: pod security context %+v; want runAsNonRoot and a non-root runAsUser", name, psc)
			}
			for _, c := range pod.Containers {
				sc := c.SecurityContext
				if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
					sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
					sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
					t.Errorf("%s/%s: security context %+v; want a read-only root, no privilege escalation, every capability dropped", name, c.Name, sc)
				}
				if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
					t.Errorf("%s/%s: resources %+v; want CPU and memory requests and a memory limit", name, c.Name, c.Resources)
				}
			}
		}
		if sa := find[corev1.ServiceAccount](p.r, p.pod.ServiceAccountName); sa != nil &&
			(sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken) {
			t.Error("the ServiceAccount mounts its token")
		}
	})
}

// TestProxyReadsTheRenderedConfig: the container is started with --config naming the file the
// ConfigMap mounts, and its ports are the ones the configuration listens on.
func TestProxyReadsTheRenderedConfig(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		args := p.container.Args
		if len(args) != 3 || args[0] != "serve" || args[1] != "--config" {
			t.Fatalf("args %q; want serve --config FILE", args)
		}
		file := args[2]
		var mounted bool
		for _, m := range p.container.VolumeMounts {
			if m.MountPath != path.Dir(file) {
				continue
			}
			for _, v := range p.pod.Volumes {
				if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == p.cm.Name {
					mounted = true
				}
			}
		}
		if !mounted {
			t.Errorf("%s is not in a mount of the ConfigMap %s", file, p.cm.Name)
		}
		if _, ok := p.cm.Data[path.Base(file)]; !ok {
			t.Errorf("ConfigMap %s has no key %s", p.cm.Name, path.Base(file))
		}
		if got, want := listenPort(t, "listen", p.cfg.Listen), containerPort(p.container, "http"); got != want {
			t.Errorf("listen port %d; container port http %d", got, want)
		}
		admin := containerPort(p.container, "admin")
		switch {
		case admin == 0 && p.cfg.Admin.Listen != "":
			t.Errorf("admin.listen %q without a container port admin", p.cfg.Admin.Listen)
		case admin != 0 && listenPort(t, "admin.listen", p.cfg.Admin.Listen) != admin:
			t.Errorf("admin.listen %q; container port admin %d", p.cfg.Admin.Listen, admin)
		}
		if p.dep.Spec.Template.Annotations["checksum/config"] == "" {
			t.Error("no checksum/config annotation: a new configuration would not roll the pods")
		}
	})
}

// TestSecretsComeFromTheSecret: no secret is in the ConfigMap or a plain variable; each comes
// from the chart's Secret or the one named in values.
func TestSecretsComeFromTheSecret(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		if p.cfg.Upstream.APIKey != "" || p.cfg.Redis.Password != "" || p.cfg.Admin.Token != "" {
			t.Error("a secret is in the ConfigMap")
		}
		for _, k := range []string{"api_key", "password", "token"} {
			if strings.Contains(p.cfgText, k+":") {
				t.Errorf("config.yaml has a %s key", k)
			}
		}
		existing, _ := p.r.vals["secrets"].(map[string]any)["existingSecret"].(string)
		secretName := fullname
		if existing != "" {
			secretName = existing
			if find[corev1.Secret](p.r, fullname) != nil {
				t.Error("the chart makes a Secret although secrets.existingSecret names one")
			}
		} else {
			must[corev1.Secret](t, p.r, fullname)
		}
		want := map[string]bool{"LLM_DEDUPE_UPSTREAM_API_KEY": true, "LLM_DEDUPE_REDIS_PASSWORD": true}
		if containerPort(p.container, "admin") != 0 {
			want["LLM_DEDUPE_ADMIN_TOKEN"] = true
		}
		for _, e := range p.container.Env {
			if !strings.HasPrefix(e.Name, "LLM_DEDUPE_") {
				continue
			}
			ref := e.ValueFrom
			if e.Value != "" || ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != secretName {
				t.Errorf("%s is not read from the Secret %s", e.Name, secretName)
			}
			if e.Name == "LLM_DEDUPE_ADMIN_TOKEN" && ref != nil && ref.SecretKeyRef != nil &&
				ref.SecretKeyRef.Optional != nil && *ref.SecretKeyRef.Optional {
				t.Error("the admin token is optional: a pod could start with the admin API on and no token")
			}
			if !want[e.Name] {
				t.Errorf("unexpected configuration variable %s", e.Name)
			}
			delete(want, e.Name)
		}
		for name := range want {
			t.Errorf("no %s", name)
		}
	})
}

func TestRedisIsTheOneTheValuesName(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		rv := p.r.vals["redis"].(map[string]any)
		inChart, _ := rv["inChart"].(map[string]any)
		c := p.cfg.Redis
		redisDep := find[appsv1.Deployment](p.r, fullname+"-redis")
		if inChart != nil && inChart["enabled"] == true {
			if redisDep == nil {
				t.Fatal("no in-chart Redis Deployment")
			}
			svc := must[corev1.Service](t, p.r, fullname+"-redis")
			if len(c.Addrs) != 1 || c.Addrs[0] != svc.Name+":6379" {
				t.Errorf("redis.addrs %q; want the in-chart Service %s:6379", c.Addrs, svc.Name)
			}
			if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, redisDep.Spec.Template.Labels) ||
				selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, p.podLabels()) {
				t.Error("the in-chart Redis Service does not select the Redis pod alone")
			}
			if *redisDep.Spec.Replicas != 1 || redisDep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
				t.Error("the in-chart Redis is not one pod replaced by recreation")
			}
			return
		}
		if redisDep != nil {
			t.Error("an in-chart Redis without redis.inChart.enabled")
		}
		mode, _ := rv["mode"].(string)
		switch {
		case len(c.Addrs) == 0:
			t.Error("no redis.addrs")
		case mode == "sentinel" && (c.MasterName == "" || len(c.Addrs) < 1):
			t.Errorf("sentinel: master_name %q, addrs %q", c.MasterName, c.Addrs)
		case mode == "cluster" && (c.MasterName != "" || len(c.Addrs) < 2):
			t.Errorf("cluster: master_name %q, addrs %q; want none and two or more", c.MasterName, c.Addrs)
		case mode == "standalone" && (c.MasterName != "" || len(c.Addrs) != 1):
			t.Errorf("standalone: master_name %q, addrs %q; want none and one", c.MasterName, c.Addrs)
		}
		if c.TLSCAFile != "" {
			var mounted bool
			for _, m := range p.container.VolumeMounts {
				if m.MountPath == path.Dir(c.TLSCAFile) {
					mounted = true
				}
			}
			if !mounted || !c.TLS {
				t.Errorf("redis.tls_ca_file %s: mounted %v, tls %v", c.TLSCAFile, mounted, c.TLS)
			}
		}
	})
}

// TestDisruptionBudgetLetsNodesDrain: the budget covers the proxy's pods and always lets one
// go, so that a node drain neither takes them all nor hangs.
func TestDisruptionBudgetLetsNodesDrain(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		pdb := must[policyv1.PodDisruptionBudget](t, p.r, fullname)
		if !selects(t, pdb.Spec.Selector, p.podLabels()) {
			t.Error("the PodDisruptionBudget does not select the proxy's pods")
		}
		replicas := int32(0)
		if p.dep.Spec.Replicas != nil {
			replicas = *p.dep.Spec.Replicas
		} else if hpa := find[autoscalingv2.HorizontalPodAutoscaler](p.r, fullname); hpa != nil {
			replicas = *hpa.Spec.MinReplicas
		}
		switch {
		case pdb.Spec.MaxUnavailable != nil:
			if pdb.Spec.MaxUnavailable.Type == intstr.Int && pdb.Spec.MaxUnavailable.IntVal < 1 {
				t.Errorf("maxUnavailable %s blocks every eviction", pdb.Spec.MaxUnavailable.String())
			}
		case pdb.Spec.MinAvailable != nil:
			if pdb.Spec.MinAvailable.Type == intstr.Int && pdb.Spec.MinAvailable.IntVal >= replicas {
				t.Errorf("minAvailable %d with %d replicas blocks every eviction", pdb.Spec.MinAvailable.IntVal, replicas)
			}
		default:
			t.Error("neither maxUnavailable nor minAvailable")
		}
	})
}

// TestChecksumsRollThePods: a change of configuration or secret changes the pod template.
func TestChecksumsRollThePods(t *testing.T) {
	annotations := func(vals map[string]any) map[string]string {
		r := newRelease(t, "changed", vals)
		return must[appsv1.Deployment](t, r, fullname).Spec.Template.Annotations
	}
	base := annotations(readValues(t, "defaults"))
	for _, tc := range []struct {
		name, annotation string
		set              map[string]any
	}{
		{"config", "checksum/config", map[string]any{"config": map[string]any{"flight": map[string]any{"result_ttl": "1m"}}}},
		{"secret", "checksum/secret", map[string]any{"secrets": map[string]any{"upstreamApiKey": "sk-other"}}},
	} {
		vals := readValues(t, "defaults")
		for k, v := range tc.set {
			vals[k] = v
		}
		if got := annotations(vals)[tc.annotation]; got == "" || got == base[tc.annotation] {
			t.Errorf("a new %s leaves %s at %q", tc.name, tc.annotation, got)
		}
	}
}
