// Package charttest checks the Helm chart in ../llm-dedupe-proxy without a cluster: it lints
// and renders the chart in process with Helm's own packages, decodes every rendered object
// strictly into its Kubernetes API type, checks the invariants the chart promises, and runs
// the rendered configuration through the proxy's own check. It is a module of its own so that
// Helm and the Kubernetes API types stay out of the proxy's go.mod. See ADR 0053.
package charttest

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "../llm-dedupe-proxy"
	repoRoot    = "../../.."
	releaseName = "prod"
	namespace   = "llm"
	// fullname is the chart's name for this release's objects.
	fullname = "prod-llm-dedupe-proxy"
	// kubeVersion is the oldest Kubernetes the chart supports (Chart.yaml kubeVersion); the
	// API types it is decoded with are k8s.io/api's, of a newer one, which keeps every field.
	kubeVersion = "v1.27.0"
)

// valueSets are the files in testdata/values, each a way to install the chart.
var valueSets = []string{"defaults", "sentinel", "cluster", "in-chart-redis", "existing-secret", "everything"}

// readValues returns the values of a set in testdata/values.
func readValues(t *testing.T, set string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(filepath.Join("testdata", "values", set+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

// render renders the chart as `helm template` does for an install of releaseName in
// namespace with vals over the chart's values.yaml: values.schema.json is checked first.
// It returns the rendered files by template path.
func render(vals map[string]any) (map[string]string, error) {
	return renderWith(vals, nil)
}

// renderWith is render with the cluster that lookup asks: nil as with `helm template`.
func renderWith(vals map[string]any, cluster engine.ClientProvider) (map[string]string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	caps.KubeVersion = *kv
	if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, kubeVersion) {
		return nil, fmt.Errorf("chart kubeVersion %q does not admit %s", ch.Metadata.KubeVersion, kubeVersion)
	}
	opts := chartutil.ReleaseOptions{Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(ch, vals, opts, caps)
	if err != nil {
		return nil, err
	}
	if cluster != nil {
		return engine.RenderWithClientProvider(ch, rv, cluster)
	}
	return engine.Render(ch, rv)
}

// object is one rendered Kubernetes object, decoded into its API type.
type object struct {
	source string // the template it came from
	kind   string
	name   string
	obj    any // *appsv1.Deployment, *corev1.Service, …
}

// newObject returns an empty value of the API type of apiVersion and kind, or nil for a kind
// the chart is not expected to make.
func newObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}
	case "v1 Secret":
		return &corev1.Secret{}
	case "v1 Service":
		return &corev1.Service{}
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1 Pod":
		return &corev1.Pod{}
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "networking.k8s.io/v1 Ingress":
		return &networkingv1.Ingress{}
	case "gateway.networking.k8s.io/v1 HTTPRoute":
		return &gatewayv1.HTTPRoute{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1 PrometheusRule":
		return &monitoringv1.PrometheusRule{}
	}
	return nil
}

// decode splits the rendered files into documents and decodes each strictly: a field its API
// type does not have, or a field given twice, fails the test.
func decode(t *testing.T, files map[string]string) []object {
	t.Helper()
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []object
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") || strings.HasPrefix(filepath.Base(name), "_") {
			continue
		}
		docs := releaseutil.SplitManifests(files[name])
		keys := make([]string, 0, len(docs))
		for k := range docs {
			keys = append(keys, k)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, k := range keys {
			doc := docs[k]
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			if tm.Kind == "" && tm.APIVersion == "" {
				continue // only comments
			}
			o := newObject(tm.APIVersion, tm.Kind)
			if o == nil {
				t.Fatalf("%s: unexpected %s %s", name, tm.APIVersion, tm.Kind)
			}
			if err := decodeStrict([]byte(doc), o); err != nil {
				t.Fatalf("%s: %s does not decode strictly: %v\n%s", name, tm.Kind, err, doc)
			}
			meta := o.(metav1.Object)
			out = append(out, object{source: name, kind: tm.Kind, name: meta.GetName(), obj: o})
		}
	}
	return out
}

// decodeStrict decodes a YAML document into o as the API server does with strict field
// validation: field names are case-sensitive, and a field o's type lacks or a field given
// twice is an error.
func decodeStrict(doc []byte, o any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(j, o, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// release is a rendered value set.
type release struct {
	set  string
	vals map[string]any // the values the templates saw: the set's over values.yaml
	objs []object
}

// newRelease renders vals and decodes the objects.
func newRelease(t *testing.T, set string, vals map[string]any) *release {
	t.Helper()
	files, err := render(vals)
	if err != nil {
		t.Fatalf("value set %s: %v", set, err)
	}
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	all, err := chartutil.CoalesceValues(ch, vals)
	if err != nil {
		t.Fatal(err)
	}
	return &release{set: set, vals: all.AsMap(), objs: decode(t, files)}
}

func renderSet(t *testing.T, set string) *release {
	t.Helper()
	return newRelease(t, set, readValues(t, set))
}

// find returns the object of type T named name, or nil.
func find[T any](r *release, name string) *T {
	for _, o := range r.objs {
		if x, ok := o.obj.(*T); ok && o.name == name {
			return x
		}
	}
	return nil
}

// all returns every object of type T.
func all[T any](r *release) []*T {
	var out []*T
	for _, o := range r.objs {
		if x, ok := o.obj.(*T); ok {
			out = append(out, x)
		}
	}
	return out
}

// must returns the object of type T named name, failing the test without it.
func must[T any](t *testing.T, r *release, name string) *T {
	t.Helper()
	x := find[T](r, name)
	if x == nil {
		var zero T
		t.Fatalf("value set %s renders no %T named %s", r.set, zero, name)
	}
	return x
}

// TestRenderEveryValueSet renders each value set and decodes every object strictly.
func TestRenderEveryValueSet(t *testing.T) {
	for _, set := range valueSets {
		t.Run(set, func(t *testing.T) {
			r := renderSet(t, set)
			if len(r.objs) == 0 {
				t.Fatal("no object rendered")
			}
		})
	}
}

func TestObjectsAreNamedAndLabelledValidly(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		for _, o := range p.r.objs {
			m := o.obj.(metav1.Object)
			if errs := validation.IsDNS1123Subdomain(m.GetName()); len(errs) > 0 {
				t.Errorf("%s %s: name: %v", o.kind, o.name, errs)
			}
			if o.kind == "Service" {
				if errs := validation.IsDNS1035Label(m.GetName()); len(errs) > 0 {
					t.Errorf("Service %s: name: %v", o.name, errs)
				}
			}
			if m.GetNamespace() != "" {
				t.Errorf("%s %s: namespace %q set; the release's is used", o.kind, o.name, m.GetNamespace())
			}
			for k, v := range m.GetLabels() {
				if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
					t.Errorf("%s %s: label %s=%s: %v", o.kind, o.name, k, v, errs)
				}
			}
			if got := m.GetLabels()["app.kubernetes.io/instance"]; got != releaseName {
				t.Errorf("%s %s: app.kubernetes.io/instance = %q; want %q", o.kind, o.name, got, releaseName)
			}
		}
	})
}
