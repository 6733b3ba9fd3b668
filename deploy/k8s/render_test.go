package k8s

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The contract between the manifests and shale-server / shalectl.
const (
	stsName       = "shale"
	peerService   = "shale-peer"
	clientService = "shale-client"
	configName    = "shale-config"
	containerName = "shale-server"
	image         = "shale:dev"
	grpcPort      = 7001
	httpPort      = 8080
	dataDir       = "/var/lib/shale"
	dataVolume    = "data"
	imageUID      = 65532
	shalectl      = "/usr/local/bin/shalectl"
	minGrace      = 60 // seconds
)

// variant is one kustomization directory and what it must render.
type variant struct {
	dir        string
	replicas   int32
	storage    string // per-pod volume size
	cpuRequest string
	memRequest string
	memLimit   string
	zoneSpread bool // a hard spread over topology.kubernetes.io/zone
	tls        bool // TLS for clients and peers from the Secret tlsSecret
}

var variants = []variant{
	{dir: "base", replicas: 3, storage: "10Gi", cpuRequest: "500m", memRequest: "1Gi", memLimit: "2Gi"},
	{dir: "overlays/dev", replicas: 3, storage: "1Gi", cpuRequest: "100m", memRequest: "256Mi", memLimit: "1Gi"},
	{dir: "overlays/prod", replicas: 5, storage: "100Gi", cpuRequest: "2", memRequest: "8Gi", memLimit: "8Gi", zoneSpread: true, tls: true},
}

// render runs kustomize on dir (relative to this package) as
// `kustomize build` does, with the default load restrictions.
func render(t *testing.T, fsys filesys.FileSystem, dir string) resmap.ResMap {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	if m.Size() == 0 {
		t.Fatalf("kustomize build %s: no resources", dir)
	}
	return m
}

// codec decodes YAML or JSON strictly: unknown fields (matched
// case-sensitively), duplicate fields and kinds outside the scheme are
// errors. The scheme holds only the API groups the manifests use.
var codec = func() *kjson.Serializer {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
}()

func decodeStrict(data []byte) (runtime.Object, error) {
	obj, _, err := codec.Decode(data, nil, nil)
	if err != nil {
		return nil, err
	}
	return obj, nil
}

// objects are the decoded objects of one rendering.
type objects struct {
	statefulSets    []*appsv1.StatefulSet
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	pdbs            []*policyv1.PodDisruptionBudget
	serviceAccounts map[string]*corev1.ServiceAccount
}

func newObjects() *objects {
	return &objects{
		services:        map[string]*corev1.Service{},
		configMaps:      map[string]*corev1.ConfigMap{},
		serviceAccounts: map[string]*corev1.ServiceAccount{},
	}
}

// add files obj by type; a kind the manifests are not meant to contain is an
// error.
func (o *objects) add(obj runtime.Object) error {
	switch v := obj.(type) {
	case *appsv1.StatefulSet:
		o.statefulSets = append(o.statefulSets, v)
	case *corev1.Service:
		o.services[v.Name] = v
	case *corev1.ConfigMap:
		o.configMaps[v.Name] = v
	case *policyv1.PodDisruptionBudget:
		o.pdbs = append(o.pdbs, v)
	case *corev1.ServiceAccount:
		o.serviceAccounts[v.Name] = v
	default:
		return fmt.Errorf("unexpected kind %s", obj.GetObjectKind().GroupVersionKind())
	}
	return nil
}

// decodeAll decodes every rendered resource strictly into its API type.
func decodeAll(t *testing.T, m resmap.ResMap) *objects {
	t.Helper()
	o := newObjects()
	for _, r := range m.Resources() {
		id := r.CurId().String()
		data, err := r.AsYAML()
		if err != nil {
			t.Errorf("%s: to YAML: %v", id, err)
			continue
		}
		obj, err := decodeStrict(data)
		if err != nil {
			t.Errorf("%s: strict decode: %v\n%s", id, err, data)
			continue
		}
		if err := o.add(obj); err != nil {
			t.Errorf("%s: %v", id, err)
		}
		// Short DNS names only work in the namespace the pods run in, which
		// the manifests leave to the user.
		if ns := r.GetNamespace(); ns != "" {
			t.Errorf("%s: namespace %q set; the manifests must be namespace-agnostic", id, ns)
		}
	}
	return o
}

// TestRender renders the base and each overlay from disk and decodes every
// object strictly into its Kubernetes API type.
func TestRender(t *testing.T) {
	for _, v := range variants {
		t.Run(v.dir, func(t *testing.T) {
			m := render(t, filesys.MakeFsOnDisk(), v.dir)
			o := decodeAll(t, m)
			var names []string
			for _, r := range m.Resources() {
				names = append(names, r.GetKind()+"/"+r.GetName())
			}
			if len(o.statefulSets) != 1 || len(o.services) != 2 || len(o.configMaps) != 1 ||
				len(o.pdbs) != 1 || len(o.serviceAccounts) != 1 || m.Size() != 6 {
				t.Errorf("rendered %v; want 1 StatefulSet, 2 Services, 1 ConfigMap, 1 PodDisruptionBudget, 1 ServiceAccount", names)
			}
		})
	}
}

// TestStrictDecodeRejects proves that the strict decoding in TestRender can
// fail: a rendered StatefulSet decodes, the same with a misspelled,
// wrongly-cased or duplicated field does not, and neither do kinds outside
// the expected set.
func TestStrictDecodeRejects(t *testing.T) {
	m := render(t, filesys.MakeFsOnDisk(), "base")
	var sts []byte
	for _, r := range m.Resources() {
		if r.GetKind() == "StatefulSet" {
			var err error
			if sts, err = r.AsYAML(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if sts == nil {
		t.Fatal("base renders no StatefulSet")
	}
	if _, err := decodeStrict(sts); err != nil {
		t.Fatalf("control: the rendered StatefulSet does not decode: %v", err)
	}
	for _, tc := range []struct {
		name, old, new, wantErr string
	}{
		{"misspelled", "serviceName: shale-peer", "servceName: shale-peer", `unknown field "spec.servceName"`},
		{"wrong case", "serviceName: shale-peer", "ServiceName: shale-peer", `unknown field "spec.ServiceName"`},
		{"container field", "imagePullPolicy: IfNotPresent", "imagePulPolicy: IfNotPresent", `unknown field "spec.template.spec.containers[0].imagePulPolicy"`},
		{"duplicate", "serviceName: shale-peer", "serviceName: shale-peer\n  serviceName: other", `key "serviceName" already set`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(string(sts), tc.old, tc.new, 1)
			if bad == string(sts) {
				t.Fatalf("%q not in the rendered StatefulSet:\n%s", tc.old, sts)
			}
			_, err := decodeStrict([]byte(bad))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("decode = %v; want an error containing %s", err, tc.wantErr)
			}
		})
	}
	t.Run("unregistered kind", func(t *testing.T) {
		_, err := decodeStrict([]byte("apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: x\n"))
		if err == nil {
			t.Error("an Ingress decoded; want an error")
		}
	})
	t.Run("unexpected kind", func(t *testing.T) {
		obj, err := decodeStrict([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\n"))
		if err != nil {
			t.Fatal(err)
		}
		if err := newObjects().add(obj); err == nil {
			t.Error("a Deployment was accepted; want an unexpected-kind error")
		}
	})
}

// TestSelfContained renders from an in-memory copy of only this directory's
// YAML files and expects the same output as from disk: the kustomizations
// need nothing outside deploy/k8s.
func TestSelfContained(t *testing.T) {
	mem := filesys.MakeFsInMemory()
	const root = "/k8s"
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		dst := path.Join(root, filepath.ToSlash(p))
		if err := mem.MkdirAll(path.Dir(dst)); err != nil {
			return err
		}
		return mem.WriteFile(dst, data)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range variants {
		t.Run(v.dir, func(t *testing.T) {
			want, err := render(t, filesys.MakeFsOnDisk(), v.dir).AsYaml()
			if err != nil {
				t.Fatal(err)
			}
			got, err := render(t, mem, path.Join(root, v.dir)).AsYaml()
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("in-memory rendering differs from disk:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestNoUnusedFiles checks that every YAML file next to a kustomization.yaml
// is used by it (kustomize silently ignores a file nobody names, such as a
// patch that was meant to apply).
func TestNoUnusedFiles(t *testing.T) {
	for _, v := range variants {
		t.Run(v.dir, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(v.dir, "kustomization.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var k types.Kustomization
			if err := yaml.UnmarshalStrict(data, &k); err != nil {
				t.Fatalf("kustomization.yaml: %v", err)
			}
			used := map[string]bool{}
			for _, r := range k.Resources {
				used[path.Clean(r)] = true
			}
			for _, p := range k.Patches {
				if p.Path != "" {
					used[path.Clean(p.Path)] = true
				}
			}
			for _, g := range k.ConfigMapGenerator {
				for _, f := range append(slices.Clone(g.EnvSources), g.FileSources...) {
					used[path.Clean(f)] = true
				}
			}
			entries, err := os.ReadDir(v.dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				name := e.Name()
				if e.IsDir() || name == "kustomization.yaml" || !strings.HasSuffix(name, ".yaml") {
					continue
				}
				if !used[name] {
					t.Errorf("%s/%s is not used by its kustomization.yaml", v.dir, name)
				}
			}
		})
	}
}

// TestManifests checks the Shale-specific wiring of each rendering.
func TestManifests(t *testing.T) {
	for _, v := range variants {
		t.Run(v.dir, func(t *testing.T) {
			o := decodeAll(t, render(t, filesys.MakeFsOnDisk(), v.dir))
			if t.Failed() {
				t.FailNow()
			}
			checkManifests(t, v, o)
		})
	}
}

func checkManifests(t *testing.T, v variant, o *objects) {
	if len(o.statefulSets) != 1 {
		t.Fatalf("%d StatefulSets; want 1", len(o.statefulSets))
	}
	sts := o.statefulSets[0]
	spec := &sts.Spec
	pod := &spec.Template.Spec
	podLabels := labels.Set(spec.Template.Labels)

	// matches reports whether sel selects the StatefulSet's pods.
	matches := func(what string, sel *metav1.LabelSelector) {
		t.Helper()
		if sel == nil {
			t.Errorf("%s: no selector", what)
			return
		}
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Errorf("%s: selector: %v", what, err)
			return
		}
		if s.Empty() || !s.Matches(podLabels) {
			t.Errorf("%s: selector %v does not select the pods (labels %v)", what, s, podLabels)
		}
	}

	// StatefulSet shape.
	if sts.Name != stsName {
		t.Errorf("StatefulSet name %q; want %q (the pod names in SHALE_INITIAL_CLUSTER)", sts.Name, stsName)
	}
	if spec.Replicas == nil || *spec.Replicas != v.replicas {
		t.Errorf("replicas %v; want %d", deref(spec.Replicas), v.replicas)
	}
	if spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q; want Parallel (the founding nodes must start together)", spec.PodManagementPolicy)
	}
	if spec.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType {
		t.Errorf("updateStrategy %q; want RollingUpdate", spec.UpdateStrategy.Type)
	}
	matches("StatefulSet", spec.Selector)
	if spec.Template.Labels["app.kubernetes.io/name"] != "shale" {
		t.Errorf("pod labels %v; want app.kubernetes.io/name=shale", spec.Template.Labels)
	}

	// Headless peer Service.
	if spec.ServiceName != peerService {
		t.Errorf("serviceName %q; want %q", spec.ServiceName, peerService)
	}
	if peer := o.services[spec.ServiceName]; peer == nil {
		t.Errorf("no Service %q (the StatefulSet's serviceName)", spec.ServiceName)
	} else {
		if peer.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("Service %s: clusterIP %q; want None (headless)", peer.Name, peer.Spec.ClusterIP)
		}
		if !peer.Spec.PublishNotReadyAddresses {
			t.Errorf("Service %s: publishNotReadyAddresses false; peers must resolve before they are Ready", peer.Name)
		}
		matches("Service "+peer.Name, &metav1.LabelSelector{MatchLabels: peer.Spec.Selector})
		checkServicePort(t, peer, "grpc", grpcPort, pod)
	}

	// Client Service.
	if c := o.services[clientService]; c == nil {
		t.Errorf("no Service %q", clientService)
	} else {
		if c.Spec.Type != corev1.ServiceTypeClusterIP || c.Spec.ClusterIP == corev1.ClusterIPNone {
			t.Errorf("Service %s: type %q clusterIP %q; want a ClusterIP Service", c.Name, c.Spec.Type, c.Spec.ClusterIP)
		}
		matches("Service "+c.Name, &metav1.LabelSelector{MatchLabels: c.Spec.Selector})
		if !labels.Equals(c.Spec.Selector, spec.Selector.MatchLabels) {
			t.Errorf("Service %s: selector %v; want the StatefulSet's %v", c.Name, c.Spec.Selector, spec.Selector.MatchLabels)
		}
		checkServicePort(t, c, "grpc", grpcPort, pod)
		checkServicePort(t, c, "http", httpPort, pod)
	}

	// PodDisruptionBudget.
	if len(o.pdbs) != 1 {
		t.Errorf("%d PodDisruptionBudgets; want 1", len(o.pdbs))
	} else {
		pdb := o.pdbs[0]
		matches("PodDisruptionBudget", pdb.Spec.Selector)
		if pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable != intstr.FromInt32(1) || pdb.Spec.MinAvailable != nil {
			t.Errorf("PodDisruptionBudget: maxUnavailable %v minAvailable %v; want maxUnavailable 1 only",
				pdb.Spec.MaxUnavailable, pdb.Spec.MinAvailable)
		}
	}

	// ServiceAccount.
	if pod.ServiceAccountName == "" || o.serviceAccounts[pod.ServiceAccountName] == nil {
		t.Errorf("serviceAccountName %q is not a rendered ServiceAccount", pod.ServiceAccountName)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken not false; Shale needs no API access")
	}
	// Service links would put SHALE_CLIENT_* variables into the SHALE_ flag
	// namespace.
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		t.Error("enableServiceLinks not false; the Service shale-client would inject SHALE_CLIENT_* variables")
	}

	// The container.
	var c *corev1.Container
	for i := range pod.Containers {
		if pod.Containers[i].Name == containerName {
			c = &pod.Containers[i]
		}
	}
	if c == nil {
		t.Fatalf("no container %q", containerName)
	}
	if c.Image != image {
		t.Errorf("image %q; want %q", c.Image, image)
	}
	if c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("imagePullPolicy %q; want IfNotPresent (the image is not in a registry)", c.ImagePullPolicy)
	}
	if port(c, "grpc") != grpcPort || port(c, "http") != httpPort {
		t.Errorf("container ports %+v; want grpc %d and http %d", c.Ports, grpcPort, httpPort)
	}

	// Configuration: envFrom the generated ConfigMap.
	if len(o.configMaps) != 1 {
		t.Fatalf("%d ConfigMaps; want 1", len(o.configMaps))
	}
	var cm *corev1.ConfigMap
	for _, m := range o.configMaps {
		cm = m
	}
	if !strings.HasPrefix(cm.Name, configName+"-") {
		t.Errorf("ConfigMap %q; want %s-<hash> (generated, so that a change rolls the pods)", cm.Name, configName)
	}
	var fromCM []string
	for _, e := range c.EnvFrom {
		if e.ConfigMapRef != nil {
			fromCM = append(fromCM, e.ConfigMapRef.Name)
		}
	}
	if !slices.Equal(fromCM, []string{cm.Name}) {
		t.Errorf("envFrom ConfigMaps %v; want [%s]", fromCM, cm.Name)
	}
	cfg := cm.Data
	for k := range cfg {
		if !isEnvFlag(k) {
			t.Errorf("ConfigMap key %q is not SHALE_<FLAG>", k)
		}
	}
	wantCfg := map[string]string{
		"SHALE_DATA_DIR":           dataDir,
		"SHALE_LISTEN":             fmt.Sprintf("0.0.0.0:%d", grpcPort),
		"SHALE_HTTP":               fmt.Sprintf("0.0.0.0:%d", httpPort),
		"SHALE_JOIN":               fmt.Sprintf("%s:%d", clientService, grpcPort),
		"SHALE_CLUSTER_NAME":       "shale",
		"SHALE_LOG_FORMAT":         "json",
		"SHALE_NODE_ID":            "0",
		"SHALE_REPLICATION_FACTOR": "3",
	}
	for k, want := range wantCfg {
		if got, ok := cfg[k]; !ok || got != want {
			t.Errorf("ConfigMap %s=%q; want %q", k, got, want)
		}
	}
	if rf, err := strconv.Atoi(cfg["SHALE_REPLICATION_FACTOR"]); err != nil || rf < 1 || int32(rf) > v.replicas {
		t.Errorf("SHALE_REPLICATION_FACTOR %q; want 1..%d", cfg["SHALE_REPLICATION_FACTOR"], v.replicas)
	}

	// The founding cluster: exactly the replicas, pod shale-i is ID i+1 and
	// advertises the address listed for it.
	members := strings.Split(cfg["SHALE_INITIAL_CLUSTER"], ",")
	if int32(len(members)) != v.replicas {
		t.Errorf("SHALE_INITIAL_CLUSTER has %d entries; want %d (the replicas): %q", len(members), v.replicas, cfg["SHALE_INITIAL_CLUSTER"])
	}
	var advertise string
	for _, a := range c.Args {
		if s, ok := strings.CutPrefix(a, "--advertise="); ok {
			advertise = s
		}
	}
	if advertise == "" {
		t.Errorf("args %q: no --advertise=", c.Args)
	}
	for i, m := range members {
		podName := fmt.Sprintf("%s-%d", sts.Name, i)
		want := fmt.Sprintf("%d=%s.%s:%d", i+1, podName, spec.ServiceName, grpcPort)
		if m != want {
			t.Errorf("SHALE_INITIAL_CLUSTER entry %d = %q; want %q", i, m, want)
		}
		// What Kubernetes makes of the argument in pod podName.
		got := expand(advertise, map[string]string{"POD_NAME": podName})
		if _, addr, _ := strings.Cut(m, "="); got != addr {
			t.Errorf("pod %s advertises %q; its SHALE_INITIAL_CLUSTER address is %q", podName, got, addr)
		}
	}
	var podNameEnv *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == "POD_NAME" {
			podNameEnv = &c.Env[i]
		}
	}
	if podNameEnv == nil || podNameEnv.ValueFrom == nil || podNameEnv.ValueFrom.FieldRef == nil ||
		podNameEnv.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("env POD_NAME %+v; want the downward API's metadata.name", podNameEnv)
	}

	// Probes.
	if p := c.ReadinessProbe; p == nil || p.GRPC == nil || p.GRPC.Port != grpcPort ||
		(p.GRPC.Service != nil && *p.GRPC.Service != "") {
		t.Errorf("readinessProbe %+v; want grpc on port %d, service \"\"", p, grpcPort)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" ||
		resolvePort(c, p.HTTPGet.Port) != httpPort {
		t.Errorf("livenessProbe %+v; want httpGet /healthz on port %d", p, httpPort)
	} else if p.PeriodSeconds != 10 || p.FailureThreshold != 6 || p.InitialDelaySeconds <= 0 && c.StartupProbe == nil {
		t.Errorf("livenessProbe period %ds, failureThreshold %d, initialDelay %ds; want 10s, 6, and a delay or a startupProbe",
			p.PeriodSeconds, p.FailureThreshold, p.InitialDelaySeconds)
	}
	if p := c.StartupProbe; p != nil {
		if p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || resolvePort(c, p.HTTPGet.Port) != httpPort {
			t.Errorf("startupProbe %+v; want httpGet /healthz on port %d", p, httpPort)
		}
	}

	// preStop: drain the node's leaderships within the grace period.
	var hook []string
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Exec != nil {
		hook = c.Lifecycle.PreStop.Exec.Command
	}
	drain := slices.Index(hook, "drain-leaders")
	if len(hook) == 0 || hook[0] != shalectl || drain < 1 || hook[drain-1] != "node" || drain != len(hook)-1 {
		t.Errorf("preStop exec %q; want %s ... node drain-leaders", hook, shalectl)
	}
	if ep := flagValue(hook, "--endpoints"); ep != fmt.Sprintf("127.0.0.1:%d", grpcPort) {
		t.Errorf("preStop --endpoints %q; want the local node, 127.0.0.1:%d", ep, grpcPort)
	}
	timeout, err := time.ParseDuration(flagValue(hook, "--timeout"))
	if err != nil || timeout <= 0 {
		t.Errorf("preStop --timeout: %v %v; want a positive duration", timeout, err)
	}
	grace := deref(pod.TerminationGracePeriodSeconds)
	if grace < minGrace || time.Duration(grace)*time.Second <= timeout {
		t.Errorf("terminationGracePeriodSeconds %d; want >= %d and more than the preStop timeout %v", grace, minGrace, timeout)
	}

	// Security.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
		deref(psc.RunAsUser) != imageUID || deref(psc.RunAsGroup) != imageUID || deref(psc.FSGroup) != imageUID ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v; want runAsNonRoot, user/group/fsGroup %d, seccomp RuntimeDefault", psc, imageUID)
	}
	for _, ctr := range allContainers(pod) {
		sc := ctr.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
			len(sc.Capabilities.Add) != 0 || sc.Privileged != nil && *sc.Privileged {
			t.Errorf("container %s securityContext %+v; want no privilege escalation, read-only root, drop ALL", ctr.Name, sc)
		}
	}

	// Storage: the claim template data, mounted at the data directory.
	if len(spec.VolumeClaimTemplates) != 1 || spec.VolumeClaimTemplates[0].Name != dataVolume {
		t.Errorf("volumeClaimTemplates %d; want one named %q", len(spec.VolumeClaimTemplates), dataVolume)
	} else {
		pvc := spec.VolumeClaimTemplates[0].Spec
		if !slices.Equal(pvc.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) {
			t.Errorf("claim template access modes %v; want ReadWriteOnce", pvc.AccessModes)
		}
		if got := pvc.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse(v.storage)) != 0 {
			t.Errorf("claim template storage %v; want %s", &got, v.storage)
		}
		// The claim templates are immutable: their labels must not come
		// from a kustomize transformer whose reach differs between versions.
		if l := spec.VolumeClaimTemplates[0].Labels; !labels.Equals(l, labels.Set{"app.kubernetes.io/name": "shale"}) {
			t.Errorf("claim template labels %v; want only app.kubernetes.io/name=shale", l)
		}
	}
	if mp := mountPath(c, dataVolume); mp != dataDir {
		t.Errorf("volume %q mounted at %q; want %s", dataVolume, mp, dataDir)
	}
	for _, ctr := range allContainers(pod) {
		for _, vm := range ctr.VolumeMounts {
			if !hasVolume(sts, vm.Name) {
				t.Errorf("container %s mounts %q, which is neither a volume nor a claim template", ctr.Name, vm.Name)
			}
		}
	}

	// Resources.
	for _, ctr := range allContainers(pod) {
		req, lim := ctr.Resources.Requests, ctr.Resources.Limits
		_, cpu := req[corev1.ResourceCPU]
		_, mem := req[corev1.ResourceMemory]
		_, memLim := lim[corev1.ResourceMemory]
		if !cpu || !mem || !memLim {
			t.Errorf("container %s resources %+v; want cpu and memory requests and a memory limit", ctr.Name, ctr.Resources)
		} else if lim.Memory().Cmp(*req.Memory()) < 0 {
			t.Errorf("container %s: memory limit %v below its request %v", ctr.Name, lim.Memory(), req.Memory())
		}
	}
	for name, want := range map[string]resource.Quantity{
		"requests.cpu":    resource.MustParse(v.cpuRequest),
		"requests.memory": resource.MustParse(v.memRequest),
		"limits.memory":   resource.MustParse(v.memLimit),
	} {
		var got resource.Quantity
		switch name {
		case "requests.cpu":
			got = *c.Resources.Requests.Cpu()
		case "requests.memory":
			got = *c.Resources.Requests.Memory()
		case "limits.memory":
			got = *c.Resources.Limits.Memory()
		}
		if got.Cmp(want) != 0 {
			t.Errorf("%s %s = %v; want %v", containerName, name, &got, &want)
		}
	}

	checkTLS(t, v, sts, c, cfg)

	// Spreading: soft over machines everywhere (dev must schedule on one
	// node), hard over zones in prod.
	hostSpread, zoneSpread := false, false
	for _, tsc := range pod.TopologySpreadConstraints {
		matches("topologySpreadConstraint "+tsc.TopologyKey, tsc.LabelSelector)
		switch {
		case tsc.TopologyKey == "kubernetes.io/hostname" && tsc.WhenUnsatisfiable == corev1.ScheduleAnyway:
			hostSpread = true
		case tsc.TopologyKey == "topology.kubernetes.io/zone" && tsc.WhenUnsatisfiable == corev1.DoNotSchedule && tsc.MaxSkew == 1:
			zoneSpread = true
		case tsc.WhenUnsatisfiable == corev1.DoNotSchedule:
			t.Errorf("unexpected hard topologySpreadConstraint on %s", tsc.TopologyKey)
		}
	}
	if !hostSpread {
		t.Error("no topologySpreadConstraint on kubernetes.io/hostname with ScheduleAnyway")
	}
	if zoneSpread != v.zoneSpread {
		t.Errorf("topologySpreadConstraint on topology.kubernetes.io/zone, DoNotSchedule, maxSkew 1: %v; want %v", zoneSpread, v.zoneSpread)
	}
	var anti *corev1.PodAntiAffinity
	if pod.Affinity != nil {
		anti = pod.Affinity.PodAntiAffinity
	}
	hostAnti := false
	if anti != nil {
		if len(anti.RequiredDuringSchedulingIgnoredDuringExecution) != 0 {
			t.Error("required podAntiAffinity: a single-node dev cluster could not schedule the pods; use preferred")
		}
		for _, w := range anti.PreferredDuringSchedulingIgnoredDuringExecution {
			if w.PodAffinityTerm.TopologyKey == "kubernetes.io/hostname" {
				hostAnti = true
				matches("podAntiAffinity", w.PodAffinityTerm.LabelSelector)
			}
		}
	}
	if !hostAnti {
		t.Error("no preferred podAntiAffinity on kubernetes.io/hostname")
	}
}

// TestEnvReferences checks that every $(VAR) in a container's command and
// args names a variable the container defines (Kubernetes leaves a reference
// to an undefined variable as it is), and that no exec hook or probe uses
// one (Kubernetes does not expand those).
func TestEnvReferences(t *testing.T) {
	for _, v := range variants {
		t.Run(v.dir, func(t *testing.T) {
			o := decodeAll(t, render(t, filesys.MakeFsOnDisk(), v.dir))
			for _, sts := range o.statefulSets {
				pod := &sts.Spec.Template.Spec
				used := 0
				for _, c := range allContainers(pod) {
					used += len(varRefs(strings.Join(append(slices.Clone(c.Command), c.Args...), " ")))
					for _, ref := range undefinedRefs(c, o.configMaps) {
						t.Errorf("container %s: %s", c.Name, ref)
					}
					for _, cmd := range unexpandedCommands(c) {
						if len(varRefs(strings.Join(cmd, " "))) != 0 {
							t.Errorf("container %s: %q uses $(VAR), which Kubernetes does not expand there", c.Name, cmd)
						}
					}
				}
				if used == 0 {
					t.Error("no $(VAR) in any container's args; want $(POD_NAME) in --advertise")
				}
			}
		})
	}
}

// TestUndefinedRefs shows that the check in TestEnvReferences fails on a
// container that uses a variable it does not define.
func TestUndefinedRefs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"--advertise=$(POD_NAME).shale-peer:7001", []string{"POD_NAME"}},
		{"$(A)$(B) $$(C) $$$(D) $(E", []string{"A", "B", "D"}},
		{"no refs $ ( $$", nil},
	} {
		if got := varRefs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("varRefs(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
	if got := expand("$(POD_NAME).x $$(POD_NAME) $(NOPE)", map[string]string{"POD_NAME": "shale-1"}); got != "shale-1.x $(POD_NAME) $(NOPE)" {
		t.Errorf("expand = %q", got)
	}

	cms := map[string]*corev1.ConfigMap{"cfg-abc": {Data: map[string]string{"SHALE_X": "1"}}}
	c := corev1.Container{
		Name:    "c",
		Command: []string{"run", "$(FROM_CM)"},
		Args:    []string{"--a=$(POD_NAME)", "--b=$(MISSING)", "--c=$(SHALE_X)", "--d=$$(ESCAPED)"},
		Env: []corev1.EnvVar{
			{Name: "POD_NAME"},
			{Name: "EARLY", Value: "$(LATE)"},
			{Name: "LATE", Value: "x"},
		},
		EnvFrom: []corev1.EnvFromSource{{
			Prefix:       "FROM_",
			ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg-abc"}},
		}},
	}
	got := undefinedRefs(c, cms)
	want := []string{`args: $(MISSING) is not defined`, `args: $(SHALE_X) is not defined`,
		`command: $(FROM_CM) is not defined`, `env EARLY: $(LATE) is not defined before it`}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("undefinedRefs = %q; want %q", got, want)
	}
}

// varRefs returns the variable names of the $(VAR) references in s, as
// Kubernetes reads them: $$ is an escaped $, and a $( without a closing ) is
// literal text.
func varRefs(s string) []string {
	var out []string
	for i := 0; i+1 < len(s); i++ {
		if s[i] != '$' {
			continue
		}
		switch s[i+1] {
		case '$':
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				return out
			}
			out = append(out, s[i+2:i+2+end])
			i += 2 + end
		}
	}
	return out
}

// expand does what Kubernetes does to a container's args: replace each
// $(VAR) with its value, leave undefined ones alone, and turn $$ into $.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// undefinedRefs lists the $(VAR) references of c that Kubernetes would leave
// unexpanded: in command and args, to a variable defined neither in env nor
// through envFrom of a ConfigMap in cms; in an env value, to one not defined
// before it.
func undefinedRefs(c corev1.Container, cms map[string]*corev1.ConfigMap) []string {
	defined := map[string]bool{}
	for _, e := range c.EnvFrom {
		if e.ConfigMapRef == nil {
			continue
		}
		if cm := cms[e.ConfigMapRef.Name]; cm != nil {
			for k := range cm.Data {
				defined[e.Prefix+k] = true
			}
		}
	}
	var out []string
	for _, e := range c.Env {
		for _, r := range varRefs(e.Value) {
			if !defined[r] {
				out = append(out, fmt.Sprintf("env %s: $(%s) is not defined before it", e.Name, r))
			}
		}
		defined[e.Name] = true
	}
	for _, part := range []struct {
		name string
		list []string
	}{{"command", c.Command}, {"args", c.Args}} {
		for _, s := range part.list {
			for _, r := range varRefs(s) {
				if !defined[r] {
					out = append(out, fmt.Sprintf("%s: $(%s) is not defined", part.name, r))
				}
			}
		}
	}
	return out
}

// unexpandedCommands returns the exec commands of c's probes and hooks,
// which Kubernetes runs as written.
func unexpandedCommands(c corev1.Container) [][]string {
	var out [][]string
	for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
		if p != nil && p.Exec != nil {
			out = append(out, p.Exec.Command)
		}
	}
	if l := c.Lifecycle; l != nil {
		for _, h := range []*corev1.LifecycleHandler{l.PostStart, l.PreStop} {
			if h != nil && h.Exec != nil {
				out = append(out, h.Exec.Command)
			}
		}
	}
	return out
}

// isEnvFlag reports whether k has the form SHALE_<FLAG_IN_UPPER_SNAKE>.
func isEnvFlag(k string) bool {
	rest, ok := strings.CutPrefix(k, "SHALE_")
	if !ok || rest == "" || rest[0] == '_' || rest[len(rest)-1] == '_' {
		return false
	}
	for _, r := range rest {
		if (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}

func checkServicePort(t *testing.T, svc *corev1.Service, name string, want int32, pod *corev1.PodSpec) {
	t.Helper()
	for _, p := range svc.Spec.Ports {
		if p.Name != name {
			continue
		}
		if p.Port != want {
			t.Errorf("Service %s port %s = %d; want %d", svc.Name, name, p.Port, want)
		}
		target := p.TargetPort
		if target == (intstr.IntOrString{}) {
			target = intstr.FromInt32(p.Port)
		}
		if got := resolvePort(&pod.Containers[0], target); got != want {
			t.Errorf("Service %s port %s targets %s, container port %d; want %d", svc.Name, name, target.String(), got, want)
		}
		return
	}
	t.Errorf("Service %s has no port named %s", svc.Name, name)
}

func allContainers(pod *corev1.PodSpec) []corev1.Container {
	return append(slices.Clone(pod.InitContainers), pod.Containers...)
}

func port(c *corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func resolvePort(c *corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.String {
		return port(c, p.StrVal)
	}
	return p.IntVal
}

func mountPath(c *corev1.Container, volume string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	return ""
}

func hasVolume(sts *appsv1.StatefulSet, name string) bool {
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name == name {
			return true
		}
	}
	for _, v := range sts.Spec.VolumeClaimTemplates {
		if v.Name == name {
			return true
		}
	}
	return false
}

// flagValue returns the value following flag in args ("--flag value" or
// "--flag=value").
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
