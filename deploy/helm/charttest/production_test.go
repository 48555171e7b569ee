package charttest

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// What a production install needs beyond the proxy's own settings: how it scales, which
// image it runs, where it may be placed, what rolls the pods, what `helm test` proves.

// TestAutoscalerScalesOnLoadAndDownSlowly: the autoscaler removes pods slowly (each one
// drains its long answers), and with openRequestsPerPod it follows the requests in
// progress instead of CPU. See ADR 0073.
func TestAutoscalerScalesOnLoadAndDownSlowly(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		hpa := find[autoscalingv2.HorizontalPodAutoscaler](p.r, fullname)
		if hpa == nil {
			return
		}
		b := hpa.Spec.Behavior
		if b == nil || b.ScaleDown == nil || b.ScaleDown.StabilizationWindowSeconds == nil || *b.ScaleDown.StabilizationWindowSeconds < 300 {
			t.Fatalf("scale-down behavior %+v; want a stabilization window of 5 minutes or more", b)
		}
		for _, pol := range b.ScaleDown.Policies {
			if pol.Type != autoscalingv2.PodsScalingPolicy || pol.Value != 1 || pol.PeriodSeconds < 60 {
				t.Errorf("scale-down policy %+v; want one pod per period of a minute or more", pol)
			}
		}
		if len(b.ScaleDown.Policies) == 0 {
			t.Error("no scale-down policy: Kubernetes may remove every surplus pod at once")
		}
		a := p.r.vals["autoscaling"].(map[string]any)
		if a["openRequestsPerPod"] == nil {
			return
		}
		if len(hpa.Spec.Metrics) != 1 {
			t.Fatalf("metrics %+v; want the open requests alone", hpa.Spec.Metrics)
		}
		m := hpa.Spec.Metrics[0]
		if m.Type != autoscalingv2.PodsMetricSourceType || m.Pods == nil || m.Pods.Metric.Name != "llm_dedupe_open_requests" ||
			m.Pods.Target.Type != autoscalingv2.AverageValueMetricType || m.Pods.Target.AverageValue == nil || m.Pods.Target.AverageValue.Sign() <= 0 {
			t.Errorf("metric %+v; want the Pods metric llm_dedupe_open_requests at an average value", m)
		}
	})
}

// TestImageIsPinnedOrPulled: an image by digest runs exactly that image; one by tag is
// pulled on each start, so that a tag pushed again is not served stale from a node's cache.
func TestImageIsPinnedOrPulled(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		img := p.r.vals["image"].(map[string]any)
		digest, _ := img["digest"].(string)
		c := p.container
		switch {
		case digest != "":
			if !strings.HasSuffix(c.Image, "@"+digest) || c.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("image %s, pull %s; want it by digest %s, IfNotPresent", c.Image, c.ImagePullPolicy, digest)
			}
		case c.ImagePullPolicy != corev1.PullAlways:
			t.Errorf("image %s by tag, pull %s; want Always", c.Image, c.ImagePullPolicy)
		}
		if test := find[corev1.Pod](p.r, fullname+"-test"); test != nil && test.Spec.Containers[0].Image != c.Image {
			t.Errorf("the test pod runs %s, the proxy %s", test.Spec.Containers[0].Image, c.Image)
		}
	})
}

// TestNodeSpreadIsAPreference: a rule would leave surge and autoscaled pods Pending on a
// full pool, and the rollout stalled with maxUnavailable 0.
func TestNodeSpreadIsAPreference(t *testing.T) {
	p := proxyOf(t, renderSet(t, "defaults"))
	for _, c := range p.pod.TopologySpreadConstraints {
		if c.TopologyKey == "kubernetes.io/hostname" && c.WhenUnsatisfiable != corev1.ScheduleAnyway {
			t.Errorf("node spread %s by default; want ScheduleAnyway", c.WhenUnsatisfiable)
		}
	}
}

// TestHelmTestNeedsRedis: `helm test` fails unless the instance that answers deduplicates
// through its Redis (cmd's TestHealthcheckRequireRedis runs the command both ways).
func TestHelmTestNeedsRedis(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		test := find[corev1.Pod](p.r, fullname+"-test")
		if test == nil {
			t.Fatal("no `helm test` pod")
		}
		if args := test.Spec.Containers[0].Args; len(args) == 0 || args[0] != "healthcheck" || !slices.Contains(args, "--require-redis") {
			t.Errorf("args %q; want healthcheck --require-redis", args)
		}
	})
}

// TestExtraPartsReachThePod: the values users add to the pod are where they belong.
func TestExtraPartsReachThePod(t *testing.T) {
	p := proxyOf(t, renderSet(t, "everything"))
	if len(p.pod.InitContainers) != 1 || p.pod.InitContainers[0].Name != "wait" {
		t.Errorf("init containers %+v; want wait", p.pod.InitContainers)
	}
	if len(p.container.EnvFrom) != 1 || p.container.EnvFrom[0].ConfigMapRef == nil {
		t.Errorf("envFrom %+v; want the ConfigMap", p.container.EnvFrom)
	}
	var vol, mount bool
	for _, v := range p.pod.Volumes {
		vol = vol || (v.Name == "upstream-ca" && v.Secret != nil)
	}
	for _, m := range p.container.VolumeMounts {
		mount = mount || (m.Name == "upstream-ca" && m.MountPath == "/etc/upstream-ca")
	}
	if !vol || !mount {
		t.Errorf("upstream-ca volume %v, mount %v; want both", vol, mount)
	}
	if p.dep.Annotations["reloader.stakater.com/auto"] != "true" || p.dep.Spec.Template.Annotations["example.com/team"] != "llm" {
		t.Errorf("deployment annotations %v, pod annotations %v", p.dep.Annotations, p.dep.Spec.Template.Annotations)
	}
}

// cluster is the API server lookup asks at install and upgrade: here, one holding a Secret.
type cluster struct{ objects []runtime.Object }

func (c cluster) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	gvr := schema.GroupVersionResource{Version: "v1", Resource: strings.ToLower(kind) + "s"}
	return dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), c.objects...).Resource(gvr), true, nil
}

func secretIn(name string, data map[string]any) cluster {
	return cluster{objects: []runtime.Object{&unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"data":     data,
	}}}}
}

// TestRotatedExistingSecretRollsThePods: an existing Secret is read at install and upgrade,
// so that `helm upgrade` after its rotation changes the pod template.
func TestRotatedExistingSecretRollsThePods(t *testing.T) {
	vals := readValues(t, "existing-secret")
	name := vals["secrets"].(map[string]any)["existingSecret"].(string)
	checksum := func(c cluster) string {
		files, err := renderWith(vals, c)
		if err != nil {
			t.Fatal(err)
		}
		r := &release{set: "existing-secret", vals: vals, objs: decode(t, files)}
		return must[appsv1.Deployment](t, r, fullname).Spec.Template.Annotations["checksum/secret"]
	}
	before := checksum(secretIn(name, map[string]any{"upstream-api-key": "c2stb2xk"}))
	after := checksum(secretIn(name, map[string]any{"upstream-api-key": "c2stbmV3"}))
	if before == "" || before == after {
		t.Errorf("checksum/secret %q before the rotation, %q after; want two different", before, after)
	}
}
