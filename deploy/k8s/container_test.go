package k8s

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// runLabel marks every container, network and volume one run of
// TestContainerStatefulSet creates; its value is the run's ID.
const runLabel = "io.shale.deploy-test.run"

// Time limits. Each overlay's run normally takes well under a minute once
// the image is built; the limits are generous for a busy 2-core machine.
const (
	runDeadline  = 3 * time.Minute // each overlay's cluster, once the image is built
	buildTimeout = 4 * time.Minute
	formTimeout  = 90 * time.Second // the cluster forms, a node joins, a node comes back
	stepTimeout  = 60 * time.Second // smaller waits
	ctlTimeout   = 15 * time.Second // shalectl --timeout of the test's own commands
	pollInterval = 500 * time.Millisecond
	logTail      = 25 // lines of each container's log in a failure message
)

func TestMain(m *testing.M) {
	// Ryuk, testcontainers' reaper, is an image from a registry and these
	// machines have none. TestContainerStatefulSet removes what it creates
	// itself (t.Cleanup) and checks that nothing is left.
	if err := os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true"); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// podTemplate is what TestContainerStatefulSet takes from the rendered
// StatefulSet and Services to run the StatefulSet's pods as containers.
type podTemplate struct {
	stsName       string
	serviceName   string // the headless Service: pod DNS names <pod>.<serviceName>
	clientService string // the client Service's name
	replicas      int
	labels        map[string]string // the pod template's labels

	image     string
	command   []string // overrides the image's ENTRYPOINT when set
	args      []string
	workDir   string
	env       []corev1.EnvVar
	fromCM    map[string]string // envFrom ConfigMaps, merged in order, prefixes applied
	ports     []string          // container ports, "7001/tcp"
	grpcPort  int32             // the container port named grpc (= the client Service's port)
	httpPort  int32             // the container port named http
	claims    []claimMount      // per-pod volumes from the volumeClaimTemplates
	tmpfs     map[string]string // emptyDir volumes: mount path -> tmpfs options
	secrets   []secretMount     // Secret volumes, the same in every pod
	preStop   []string
	grace     time.Duration
	startup   *corev1.Probe // nil: none
	startPort int32         // the startup probe's container port
	readiness *corev1.Probe // nil: none; a grpc probe
	user      string        // uid[:gid] from runAsUser and runAsGroup
	groups    []string      // fsGroup and supplementalGroups
	fsGroup   *int64
	hostCfg   func(*container.HostConfig)
	initialID map[string]uint64 // SHALE_INITIAL_CLUSTER: address -> node ID
}

type claimMount struct {
	claim, mountPath string
	readOnly         bool
}

// secretMount is a Secret volume mounted whole (Secret volumes are always
// read-only).
type secretMount struct {
	secret, mountPath string
	mode              os.FileMode // the files' mode (defaultMode)
}

// renderPods renders the kustomization dir and extracts the pod template of
// its StatefulSet. Anything in the template that changes how the container
// runs and that the test cannot reproduce with Docker is an error rather
// than silently ignored. The liveness probe is not run, and the readiness
// probe only where the test says: the test checks the cluster with
// shalectl instead.
func renderPods(t *testing.T, dir string) *podTemplate {
	t.Helper()
	o := decodeAll(t, render(t, filesys.MakeFsOnDisk(), dir))
	if t.Failed() {
		t.FailNow()
	}
	if len(o.statefulSets) != 1 {
		t.Fatalf("%s: %d StatefulSets; want 1", dir, len(o.statefulSets))
	}
	sts := o.statefulSets[0]
	spec := &sts.Spec
	pod := &spec.Template.Spec
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }

	tp := &podTemplate{
		stsName:     sts.Name,
		serviceName: spec.ServiceName,
		replicas:    1, // the API's default
		labels:      spec.Template.Labels,
		tmpfs:       map[string]string{},
		fromCM:      map[string]string{},
		grace:       30 * time.Second, // the API's default
		initialID:   map[string]uint64{},
	}
	if spec.Replicas != nil {
		tp.replicas = int(*spec.Replicas)
	}
	if pod.TerminationGracePeriodSeconds != nil {
		tp.grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	if spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		bad("podManagementPolicy %q: the test starts the pods all at once, as Parallel does", spec.PodManagementPolicy)
	}
	if peer := o.services[spec.ServiceName]; peer == nil || peer.Spec.ClusterIP != corev1.ClusterIPNone {
		bad("serviceName %q is not a rendered headless Service", spec.ServiceName)
	}
	if len(pod.InitContainers) != 0 || len(pod.Containers) != 1 {
		bad("%d init containers and %d containers; the test runs exactly one container per pod",
			len(pod.InitContainers), len(pod.Containers))
		t.Fatal(strings.Join(errs, "\n"))
	}
	c := &pod.Containers[0]
	tp.image, tp.command, tp.args, tp.workDir, tp.env = c.Image, c.Command, c.Args, c.WorkingDir, c.Env

	// Environment: envFrom ConfigMaps (the generated, hash-suffixed one),
	// then env, as the kubelet builds it.
	for _, e := range c.EnvFrom {
		if e.ConfigMapRef == nil {
			bad("envFrom %+v: only configMapRef is handled", e)
			continue
		}
		cm := o.configMaps[e.ConfigMapRef.Name]
		if cm == nil {
			bad("envFrom ConfigMap %q is not rendered", e.ConfigMapRef.Name)
			continue
		}
		for k, v := range cm.Data {
			tp.fromCM[e.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			continue
		}
		if f := e.ValueFrom.FieldRef; f == nil || f.FieldPath != "metadata.name" || e.ValueFrom.ResourceFieldRef != nil ||
			e.ValueFrom.ConfigMapKeyRef != nil || e.ValueFrom.SecretKeyRef != nil {
			bad("env %s: valueFrom %+v; the test handles only fieldRef metadata.name", e.Name, e.ValueFrom)
		}
	}

	// Ports, and the client Service that reaches the gRPC port.
	for _, p := range c.Ports {
		if p.HostPort != 0 || p.HostIP != "" {
			bad("container port %+v: hostPort is not handled", p)
		}
		proto := strings.ToLower(string(p.Protocol))
		if proto == "" {
			proto = "tcp"
		}
		tp.ports = append(tp.ports, fmt.Sprintf("%d/%s", p.ContainerPort, proto))
	}
	if tp.grpcPort = port(c, "grpc"); tp.grpcPort == 0 {
		bad("no container port named grpc in %+v", c.Ports)
	}
	tp.httpPort = port(c, "http")
	podLabels := labels.Set(spec.Template.Labels)
	for _, svc := range o.services {
		if svc.Spec.ClusterIP == corev1.ClusterIPNone || len(svc.Spec.Selector) == 0 ||
			!labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			continue
		}
		if tp.clientService != "" {
			bad("two client Services select the pods: %s and %s", tp.clientService, svc.Name)
		}
		tp.clientService = svc.Name
		found := false
		for _, sp := range svc.Spec.Ports {
			target := sp.TargetPort
			if target.IntVal == 0 && target.StrVal == "" {
				target.IntVal = sp.Port
			}
			if resolvePort(c, target) != tp.grpcPort {
				continue
			}
			found = true
			// A Docker network alias cannot map a port.
			if sp.Port != tp.grpcPort {
				bad("Service %s: port %d targets the gRPC container port %d; the test can only emulate equal ports",
					svc.Name, sp.Port, tp.grpcPort)
			}
		}
		if !found {
			bad("Service %s has no port targeting the gRPC container port %d", svc.Name, tp.grpcPort)
		}
	}
	if tp.clientService == "" {
		bad("no ClusterIP Service selects the pods (labels %v)", podLabels)
	}

	// Volumes: each claim template becomes a named volume per pod, each
	// emptyDir a tmpfs, each Secret a directory the test fills, bound
	// read-only.
	for _, vm := range c.VolumeMounts {
		if vm.SubPath != "" || vm.SubPathExpr != "" || vm.MountPropagation != nil {
			bad("volumeMount %+v: subPath and propagation are not handled", vm)
		}
		isClaim := slices.ContainsFunc(spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == vm.Name })
		if isClaim {
			tp.claims = append(tp.claims, claimMount{claim: vm.Name, mountPath: vm.MountPath, readOnly: vm.ReadOnly})
			continue
		}
		i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if i >= 0 && pod.Volumes[i].Secret != nil {
			sec := pod.Volumes[i].Secret
			mode := os.FileMode(0o644) // the API's default
			if sec.DefaultMode != nil {
				mode = os.FileMode(*sec.DefaultMode)
			}
			if len(sec.Items) != 0 || deref(sec.Optional) {
				bad("Secret volume %s: items and optional are not handled", vm.Name)
			}
			tp.secrets = append(tp.secrets, secretMount{secret: sec.SecretName, mountPath: vm.MountPath, mode: mode})
			continue
		}
		if i < 0 || pod.Volumes[i].EmptyDir == nil {
			bad("volumeMount %s: only claim templates, emptyDir and Secret volumes are handled", vm.Name)
			continue
		}
		opts := []string{"rw", "mode=1777"}
		if vm.ReadOnly {
			opts[0] = "ro"
		}
		if l := pod.Volumes[i].EmptyDir.SizeLimit; l != nil {
			opts = append(opts, "size="+strconv.FormatInt(l.Value(), 10))
		}
		tp.tmpfs[vm.MountPath] = strings.Join(opts, ",")
	}
	if !slices.ContainsFunc(tp.claims, func(m claimMount) bool { return m.claim == dataVolume }) {
		bad("the claim template %q is not mounted", dataVolume)
	}

	// preStop and the startup probe.
	if l := c.Lifecycle; l == nil || l.PreStop == nil || l.PreStop.Exec == nil || len(l.PreStop.Exec.Command) == 0 {
		bad("no preStop exec hook")
	} else {
		tp.preStop = l.PreStop.Exec.Command
	}
	if l := c.Lifecycle; l != nil && l.PostStart != nil {
		bad("a postStart hook is not handled")
	}
	if p := c.StartupProbe; p != nil {
		if g := p.HTTPGet; g == nil || g.Host != "" || resolvePort(c, g.Port) == 0 ||
			(g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP && g.Scheme != corev1.URISchemeHTTPS) {
			bad("startupProbe %+v: only httpGet over HTTP or HTTPS to a container port is handled", p.ProbeHandler)
		} else {
			tp.startup, tp.startPort = p, resolvePort(c, g.Port)
		}
	}
	if p := c.ReadinessProbe; p != nil {
		if p.GRPC == nil {
			bad("readinessProbe %+v: only grpc is handled", p.ProbeHandler)
		} else {
			tp.readiness = p
		}
	}

	// Security context, pod-level with the container's overrides.
	psc, csc := pod.SecurityContext, c.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	uid, gid := psc.RunAsUser, psc.RunAsGroup
	if csc.RunAsUser != nil {
		uid = csc.RunAsUser
	}
	if csc.RunAsGroup != nil {
		gid = csc.RunAsGroup
	}
	if uid == nil {
		bad("no securityContext.runAsUser: the test runs the pods as that user")
	} else {
		tp.user = strconv.FormatInt(*uid, 10)
		if gid != nil {
			tp.user += ":" + strconv.FormatInt(*gid, 10)
		}
		nonRoot := psc.RunAsNonRoot
		if csc.RunAsNonRoot != nil {
			nonRoot = csc.RunAsNonRoot
		}
		if deref(nonRoot) && *uid == 0 {
			bad("runAsNonRoot with runAsUser 0: the kubelet would refuse to start the container")
		}
	}
	if psc.FSGroup != nil {
		tp.groups = append(tp.groups, strconv.FormatInt(*psc.FSGroup, 10))
		tp.fsGroup = psc.FSGroup
	}
	for _, g := range psc.SupplementalGroups {
		tp.groups = append(tp.groups, strconv.FormatInt(g, 10))
	}
	seccomp := psc.SeccompProfile
	if csc.SeccompProfile != nil {
		seccomp = csc.SeccompProfile
	}
	if seccomp != nil && seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		bad("seccompProfile %q: only RuntimeDefault (Docker's default profile) is handled", seccomp.Type)
	}
	var capAdd, capDrop []string
	if csc.Capabilities != nil {
		for _, c := range csc.Capabilities.Add {
			capAdd = append(capAdd, string(c))
		}
		for _, c := range csc.Capabilities.Drop {
			capDrop = append(capDrop, string(c))
		}
	}
	readOnly := deref(csc.ReadOnlyRootFilesystem)
	privileged := deref(csc.Privileged)
	noNewPrivs := csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation

	// Resources as the kubelet sets the cgroup: memory limit, CPU limit as
	// a quota, CPU request as shares.
	res := c.Resources
	tp.hostCfg = func(hc *container.HostConfig) {
		hc.ReadonlyRootfs = readOnly
		hc.Privileged = privileged
		hc.CapAdd, hc.CapDrop = capAdd, capDrop
		if noNewPrivs {
			hc.SecurityOpt = append(hc.SecurityOpt, "no-new-privileges:true")
		}
		hc.GroupAdd = tp.groups
		if m, ok := res.Limits[corev1.ResourceMemory]; ok {
			hc.Memory = m.Value()
		}
		if cpu, ok := res.Limits[corev1.ResourceCPU]; ok {
			hc.NanoCPUs = cpu.MilliValue() * 1_000_000
		}
		if cpu, ok := res.Requests[corev1.ResourceCPU]; ok {
			hc.CPUShares = max(cpu.MilliValue()*1024/1000, 2)
		}
	}

	// The founding members, to check that each pod takes its listed ID.
	if ic := tp.fromCM["SHALE_INITIAL_CLUSTER"]; ic != "" {
		for _, m := range strings.Split(ic, ",") {
			idStr, addr, _ := strings.Cut(m, "=")
			id, err := strconv.ParseUint(idStr, 10, 64)
			if err != nil {
				bad("SHALE_INITIAL_CLUSTER entry %q: %v", m, err)
			}
			tp.initialID[addr] = id
		}
	}
	if len(errs) > 0 {
		t.Fatalf("%s: the pod template uses what the test cannot run as Kubernetes would:\n%s", dir, strings.Join(errs, "\n"))
	}
	return tp
}

// podEnv is the environment the kubelet gives pod `pod`: envFrom, then env
// in order, each value expanded with the variables defined before it.
func (tp *podTemplate) podEnv(pod string) map[string]string {
	env := map[string]string{}
	for k, v := range tp.fromCM {
		env[k] = v
	}
	for _, e := range tp.env {
		if e.ValueFrom != nil { // fieldRef metadata.name: renderPods checked it
			env[e.Name] = pod
			continue
		}
		env[e.Name] = expand(e.Value, env)
	}
	return env
}

func expandAll(list []string, env map[string]string) []string {
	var out []string
	for _, s := range list {
		out = append(out, expand(s, env))
	}
	return out
}

func (tp *podTemplate) podName(ordinal int) string { return fmt.Sprintf("%s-%d", tp.stsName, ordinal) }

// address is pod's DNS name through the headless Service, with the gRPC port.
func (tp *podTemplate) address(pod string) string {
	return fmt.Sprintf("%s.%s:%d", pod, tp.serviceName, tp.grpcPort)
}

func (tp *podTemplate) clientEndpoint() string {
	return fmt.Sprintf("%s:%d", tp.clientService, tp.grpcPort)
}

func (tp *podTemplate) localEndpoint() string { return fmt.Sprintf("127.0.0.1:%d", tp.grpcPort) }

// httpProbe is an httpGet probe run as the kubelet runs it: against the
// pod's IP (here the container's address on the test network), successful
// on a status from 200 to 399, every period up to failureThreshold times;
// over HTTPS without verifying the certificate, as the kubelet does.
// As a testcontainers wait strategy it makes a container started once its
// startup probe passes. It polls more often than periodSeconds to keep the
// test fast, but gives up after as long as the kubelet would.
//
// It does not use testcontainers' wait.ForHTTP, which connects to the port
// published on the Docker host: on these machines testcontainers thinks it
// runs in a container (/.dockerenv exists), finds no gateway in the bridge
// network's IPAM configuration and falls back to the default route's
// gateway, which is not the Docker host. Probing the container's address
// needs the test to run on the Docker host (or in its network namespace).
type httpProbe struct {
	network string
	probe   *corev1.Probe
	port    int32
}

func (p httpProbe) WaitUntilReady(ctx context.Context, target wait.StrategyTarget) error {
	g := p.probe.HTTPGet
	period, failures := max(p.probe.PeriodSeconds, 1), max(p.probe.FailureThreshold, 1)
	ctx, cancel := context.WithTimeout(ctx, time.Duration(p.probe.InitialDelaySeconds+period*failures)*time.Second)
	defer cancel()
	hc := &http.Client{
		Timeout:   time.Duration(max(p.probe.TimeoutSeconds, 1)) * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // as the kubelet
	}
	var last error
	for {
		if err := p.try(ctx, target, hc, g); err == nil {
			return nil
		} else if errors.Is(err, errNotRunning) {
			return err
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("startup probe %s on port %d: %w (last: %v)", g.Path, p.port, ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

var errNotRunning = errors.New("container is not running")

func (p httpProbe) try(ctx context.Context, target wait.StrategyTarget, hc *http.Client, g *corev1.HTTPGetAction) error {
	insp, err := target.Inspect(ctx)
	if err != nil {
		return err
	}
	if insp.State == nil || !insp.State.Running {
		return fmt.Errorf("%w: %+v", errNotRunning, insp.State)
	}
	ep := insp.NetworkSettings.Networks[p.network]
	if ep == nil || !ep.IPAddress.IsValid() {
		return fmt.Errorf("no address on network %s yet", p.network)
	}
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort(ep.IPAddress.String(), strconv.Itoa(int(p.port))), Path: g.Path}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "kube-probe/shale-deploy-test")
	for _, h := range g.HTTPHeaders {
		req.Header.Set(h.Name, h.Value)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: %s", u.String(), resp.Status)
	}
	return nil
}

// overlayRuns are the overlays TestContainerStatefulSet runs, and whether
// their pods serve TLS (from a Secret the test makes).
var overlayRuns = []struct {
	dir string
	tls bool
}{
	{"overlays/dev", false},
	{"overlays/prod", true},
}

// TestContainerStatefulSet runs the image on a Docker network as the
// rendered overlays' StatefulSets run their pods on Kubernetes, the closest
// to a real cluster these machines allow: one container per pod with the
// pod's name, environment, arguments, user, security context, resources,
// per-pod volume and Secret volumes, reachable by the DNS names the
// headless and the client Service give it. For each overlay it checks that
// the founding pods form a serving cluster and pass their readiness probe,
// that a pod beyond the founding ones joins (scaling up), and that the
// preStop hook, a stop within the grace period and a restart on the same
// volume work as a rolling update needs them to. The prod overlay runs with
// TLS: the test makes the Secret shale-tls (a CA and the node certificate
// that cert-manager/certificates.yaml describes, laid out as the kubelet
// lays out a Secret volume), and checks that plaintext and certificate-less
// clients are refused, that a client with a certificate of the CA is
// served, that the HTTP port serves HTTPS, and that a renewed certificate
// reaches the running pods.
func TestContainerStatefulSet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image and runs clusters in Docker; skipped with -short")
	}
	begin := time.Now()
	tps := map[string]*podTemplate{}
	for _, r := range overlayRuns {
		tps[r.dir] = renderPods(t, r.dir)
	}
	ctx := context.Background()
	docker, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, stepTimeout)
		_, err = docker.Ping(pctx, client.PingOptions{})
		cancel()
	}
	if err != nil {
		// CI machines have a Docker engine: there, its absence is a failure.
		if os.Getenv("CI") != "" {
			t.Fatalf("no Docker engine: %v", err)
		}
		t.Skipf("no Docker engine (the test needs one; under CI=true this fails): %v", err)
	}
	t.Cleanup(func() { _ = docker.Close() })
	images := map[string]string{} // the rendered image -> the one to run
	for _, r := range overlayRuns {
		if img := tps[r.dir].image; images[img] == "" {
			images[img] = buildImage(ctx, t, docker, img)
		}
	}
	for _, r := range overlayRuns {
		t.Run(r.dir, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
			defer cancel()
			tp := tps[r.dir]
			h := &harness{t: t, tp: tp, docker: docker, runID: randomID(t), image: images[tp.image]}
			// Registered first, so it runs after every other cleanup.
			t.Cleanup(h.checkNothingLeft)
			h.run(ctx, r.tls)
		})
	}
	t.Logf("done in %v", time.Since(begin).Round(time.Millisecond))
}

// run runs one overlay's pods through the scenario of
// TestContainerStatefulSet.
func (h *harness) run(ctx context.Context, wantTLS bool) {
	t, tp := h.t, h.tp
	begin := time.Now()
	_, tlsOn := tp.podEnv(tp.podName(0))["SHALE_CERT_FILE"]
	if tlsOn != wantTLS {
		t.Fatalf("SHALE_CERT_FILE set: %v; want TLS %v", tlsOn, wantTLS)
	}
	h.secrets = map[string]*secretVolume{}
	for _, m := range tp.secrets {
		if m.secret != tlsSecret {
			t.Fatalf("Secret volume of %s: the test does not know what to put in it", m.secret)
		}
		if h.secrets[m.secret] == nil {
			h.secrets[m.secret] = newSecretVolume(t, m.mode, tp.fsGroup)
		}
	}
	if sv := h.secrets[tlsSecret]; sv != nil {
		h.pki = newTestPKI(t)
		sv.write(t, h.pki.secretFiles(h.pki.node))
	}
	if wantTLS && h.pki == nil {
		t.Fatalf("no volume of the Secret %s", tlsSecret)
	}

	nw, err := network.New(ctx, network.WithLabels(map[string]string{runLabel: h.runID}))
	testcontainers.CleanupNetwork(t, nw)
	if err != nil {
		t.Fatalf("create network: %v", err)
	}
	h.netName = nw.Name
	t.Logf("run %s: network %s; pods of StatefulSet %s (serviceName %s, client Service %s), image %s, TLS %v",
		h.runID, nw.Name, tp.stsName, tp.serviceName, tp.clientService, h.image, wantTLS)

	// 1. The founding pods, all at once (podManagementPolicy: Parallel).
	step := time.Now()
	var ordinals []int
	for i := range tp.replicas {
		ordinals = append(ordinals, i)
	}
	founders := h.startPods(ctx, ordinals...)
	t.Logf("started %d pods in %v", len(founders), time.Since(step).Round(time.Millisecond))

	// 2. They form a cluster: every pod a live node at its DNS name with
	// the ID SHALE_INITIAL_CLUSTER lists for it, every shard led, every pod
	// Ready.
	step = time.Now()
	var addrs []string
	for _, p := range founders {
		addrs = append(addrs, tp.address(p.name))
	}
	var st *clusterStatus
	h.poll(ctx, formTimeout, "the founding pods form a cluster", func(ctx context.Context) (err error) {
		if st, err = h.status(ctx, founders[0], tp.clientEndpoint()); err != nil {
			return err
		}
		return st.check(addrs)
	})
	ids := map[string]uint64{} // pod name -> node ID
	for _, p := range founders {
		addr := tp.address(p.name)
		id := uint64(st.members()[addr].Node.NodeID)
		if want, ok := tp.initialID[addr]; ok && id != want {
			h.fatalf("pod %s (%s) is node %d; SHALE_INITIAL_CLUSTER lists it as %d", p.name, addr, id, want)
		}
		ids[p.name] = id
	}
	h.poll(ctx, stepTimeout, "the founding pods pass their readiness probe", func(ctx context.Context) error {
		return h.ready(ctx, founders)
	})
	t.Logf("cluster %s formed in %v: %d nodes %v, %d shards", st.ClusterID,
		time.Since(step).Round(time.Millisecond), len(ids), ids, len(st.Shards))

	// 3. It serves: a write through the client Service from one pod, read
	// back in another pod through that pod's own node.
	key, value := "deploy-test/"+h.runID, "value-"+h.runID
	if _, err := h.ctl(ctx, founders[0], tp.clientEndpoint(), "kv", "put", key, value); err != nil {
		h.fatalf("kv put: %v", err)
	}
	reader := founders[1%len(founders)]
	if err := h.getValue(ctx, reader, tp.localEndpoint(), key, value); err != nil {
		h.fatalf("kv get in %s: %v", reader.name, err)
	}

	// TLS: who is served and who is refused, then a certificate renewal.
	if wantTLS {
		step = time.Now()
		h.checkTLSServing(ctx, founders, key, value)
		h.rotateNodeCert(ctx, founders, key, value)
		t.Logf("TLS checked and the node certificate renewed in %v", time.Since(step).Round(time.Millisecond))
	}

	// 4. Scale up: the pod with the next ordinal is not in
	// SHALE_INITIAL_CLUSTER and joins through SHALE_JOIN.
	step = time.Now()
	joiner := h.startPods(ctx, tp.replicas)[0]
	all := append(slices.Clone(addrs), tp.address(joiner.name))
	var joinedID uint64
	h.poll(ctx, formTimeout, joiner.name+" joins the cluster", func(ctx context.Context) error {
		r, err := h.ctl(ctx, founders[0], tp.clientEndpoint(), "-o", "json", "node", "list")
		if err != nil {
			return err
		}
		var nl clusterStatus
		if err := json.Unmarshal([]byte(r.stdout), &nl); err != nil {
			return fmt.Errorf("node list -o json: %v\n%s", err, r.stdout)
		}
		if err := nl.checkNodes(all); err != nil {
			return err
		}
		joinedID = uint64(nl.members()[tp.address(joiner.name)].Node.NodeID)
		return nil
	})
	for name, id := range ids {
		if id == joinedID {
			h.fatalf("%s joined as node %d, the ID of %s", joiner.name, joinedID, name)
		}
	}
	if err := h.getValue(ctx, joiner, tp.localEndpoint(), key, value); err != nil {
		h.fatalf("kv get in %s: %v", joiner.name, err)
	}
	ids[joiner.name] = joinedID
	t.Logf("%s joined as node %d in %v", joiner.name, joinedID, time.Since(step).Round(time.Millisecond))

	// 5. The preStop hook, in a founding pod that leads a shard.
	step = time.Now()
	var victim *pod
	h.poll(ctx, stepTimeout, "a founding node leads a shard", func(ctx context.Context) error {
		s, err := h.status(ctx, founders[0], tp.clientEndpoint())
		if err != nil {
			return err
		}
		for _, p := range founders {
			if len(s.leads(ids[p.name])) > 0 {
				victim = p
				return nil
			}
		}
		// None does: hand one a leadership.
		for _, sh := range s.Shards {
			if sh.Descriptor.Retired || sh.LeaderNodeID == 0 {
				continue
			}
			for _, p := range founders {
				if !sh.hasVoter(ids[p.name]) {
					continue
				}
				shard, node := strconv.FormatUint(uint64(sh.Descriptor.ShardID), 10), strconv.FormatUint(ids[p.name], 10)
				if _, err := h.ctl(ctx, founders[0], tp.clientEndpoint(), "leader", "transfer", shard, node, "--no-pin"); err != nil {
					return err
				}
				return fmt.Errorf("no founding node led a shard; moved shard %s's leadership to node %s", shard, node)
			}
		}
		return errors.New("no founding node leads a shard or holds a voter of a led shard")
	})
	victimID := ids[victim.name]
	r, err := h.exec(ctx, victim, tp.grace, tp.preStop)
	if err != nil || r.code != 0 || !strings.Contains(r.stdout, "leads no shard") {
		h.fatalf("preStop %q in %s: exit %d, err %v; want exit 0 and \"leads no shard\"\nstdout: %s\nstderr: %s",
			tp.preStop, victim.name, r.code, err, r.stdout, r.stderr)
	}
	t.Logf("preStop in %s (node %d) in %v: %s", victim.name, victimID, time.Since(step).Round(time.Millisecond), strings.TrimSpace(r.stdout))
	other := founders[(victim.ordinal+1)%len(founders)]
	h.poll(ctx, stepTimeout, fmt.Sprintf("node %d leads no shard", victimID), func(ctx context.Context) error {
		s, err := h.status(ctx, other, tp.clientEndpoint())
		if err != nil {
			return err
		}
		n, ok := s.byID(victimID)
		if !ok {
			return fmt.Errorf("node %d is not in the cluster status", victimID)
		}
		if led := s.leads(victimID); len(led) > 0 || n.LeaderCount != 0 {
			return fmt.Errorf("node %d: leads shards %v, leader_count %d", victimID, led, n.LeaderCount)
		}
		return nil
	})

	// 6. The kubelet's stop: SIGTERM, SIGKILL after the grace period.
	step = time.Now()
	insp, err := victim.ctr.Inspect(ctx)
	if err != nil {
		h.fatalf("inspect %s: %v", victim.name, err)
	}
	if sig := insp.Config.StopSignal; sig != "" && sig != "SIGTERM" && sig != "TERM" && sig != "15" {
		h.fatalf("%s: stop signal %s; the test stops with SIGTERM", victim.name, sig)
	}
	grace := tp.grace
	if err := victim.ctr.Stop(ctx, &grace); err != nil {
		h.fatalf("stop %s: %v", victim.name, err)
	}
	took := time.Since(step)
	state, err := victim.ctr.State(ctx)
	if err != nil {
		h.fatalf("state of %s: %v", victim.name, err)
	}
	if state.Running || state.ExitCode != 0 || state.OOMKilled {
		h.fatalf("%s after SIGTERM: running %v, exit code %d, OOM-killed %v after %v (grace %v); want exit code 0",
			victim.name, state.Running, state.ExitCode, state.OOMKilled, took, grace)
	}
	t.Logf("%s stopped with exit code 0 in %v (grace %v)", victim.name, took.Round(time.Millisecond), grace)
	// One pod away (the PodDisruptionBudget's maxUnavailable), the others
	// serve; the stopped pod has left the client Service's DNS name.
	if err := h.getValue(ctx, other, tp.clientEndpoint(), key, value); err != nil {
		h.fatalf("kv get in %s with %s stopped: %v", other.name, victim.name, err)
	}

	// 7. The pod comes back on its volume as the same node.
	step = time.Now()
	if err := victim.ctr.Start(ctx); err != nil {
		h.fatalf("restart %s: %v", victim.name, err)
	}
	h.poll(ctx, formTimeout, victim.name+" serves again", func(ctx context.Context) error {
		if err := h.getValue(ctx, victim, tp.localEndpoint(), key, value); err != nil {
			return err
		}
		s, err := h.status(ctx, victim, tp.clientEndpoint())
		if err != nil {
			return err
		}
		if id := uint64(s.members()[tp.address(victim.name)].Node.NodeID); id != victimID {
			return fmt.Errorf("%s is node %d after the restart; want %d", victim.name, id, victimID)
		}
		if err := s.check(all); err != nil {
			return err
		}
		return h.ready(ctx, []*pod{victim})
	})
	t.Logf("%s back as node %d in %v", victim.name, victimID, time.Since(step).Round(time.Millisecond))

	for _, p := range h.pods {
		if s, err := p.ctr.State(ctx); err != nil || !s.Running {
			h.fatalf("%s: state %+v, err %v; want running", p.name, s, err)
		}
	}
	t.Logf("done in %v", time.Since(begin).Round(time.Millisecond))
}

// pod is one StatefulSet pod run as a container.
type pod struct {
	name    string // <statefulset>-<ordinal>
	ordinal int
	volumes map[string]string // claim template -> Docker volume
	ctr     testcontainers.Container
}

type harness struct {
	t       *testing.T
	tp      *podTemplate
	docker  *testcontainers.DockerClient
	runID   string
	image   string
	netName string
	pods    []*pod                   // started, in order
	secrets map[string]*secretVolume // by Secret name, bound into every pod
	pki     *testPKI                 // the certificates of the Secret tlsSecret, if any
}

func randomID(t *testing.T) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// buildImage builds the rendered image with scripts/build-image.sh, or
// returns $SHALE_IMAGE; either must be in the engine (nothing is pulled).
func buildImage(ctx context.Context, t *testing.T, docker *testcontainers.DockerClient, rendered string) string {
	t.Helper()
	img := os.Getenv("SHALE_IMAGE")
	if img == "" {
		img = rendered
		script, err := findUp(filepath.Join("scripts", "build-image.sh"))
		if err != nil {
			t.Fatal(err)
		}
		bctx, cancel := context.WithTimeout(ctx, buildTimeout)
		defer cancel()
		start := time.Now()
		cmd := exec.CommandContext(bctx, script, img)
		cmd.Dir = filepath.Dir(filepath.Dir(script))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s: %v\n%s%s", script, img, err, &stdout, &stderr)
		}
		t.Logf("%s (%v)", strings.TrimSpace(stdout.String()), time.Since(start).Round(time.Millisecond))
	}
	if _, err := docker.ImageInspect(ctx, img); err != nil {
		t.Fatalf("image %s: %v (it must be in the Docker engine: nothing can be pulled)", img, err)
	}
	return img
}

// findUp looks for rel in the working directory and its parents.
func findUp(rel string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("%s not found in %s or a parent directory", rel, wd)
		}
	}
}

func (h *harness) labels(extra map[string]string) map[string]string {
	l := map[string]string{runLabel: h.runID}
	for k, v := range extra {
		l[k] = v
	}
	return l
}

// startPods creates the volumes of the pods with the given ordinals and
// starts their containers concurrently; each is started once its startup
// probe passes.
func (h *harness) startPods(ctx context.Context, ordinals ...int) []*pod {
	t := h.t
	var pods []*pod
	for _, ord := range ordinals {
		p := &pod{name: h.tp.podName(ord), ordinal: ord, volumes: map[string]string{}}
		for _, m := range h.tp.claims {
			// <claim>-<pod>, as the StatefulSet names the claim, and the run.
			vol := fmt.Sprintf("%s-%s-%s", m.claim, p.name, h.runID)
			if _, err := h.docker.VolumeCreate(ctx, client.VolumeCreateOptions{Name: vol, Labels: h.labels(nil)}); err != nil {
				t.Fatalf("create volume %s: %v", vol, err)
			}
			// Registered before the container's cleanup, so it runs after it.
			t.Cleanup(func() { h.removeVolume(vol) })
			p.volumes[m.claim] = vol
		}
		pods = append(pods, p)
	}
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Go(func() {
			ctr, err := testcontainers.GenericContainer(ctx, h.request(p))
			p.ctr = ctr
			if err != nil {
				errs[i] = fmt.Errorf("pod %s: %w", p.name, err)
			}
		})
	}
	wg.Wait()
	for _, p := range pods {
		// Graceful stops are tested above; clean up fast.
		testcontainers.CleanupContainer(t, p.ctr, testcontainers.StopTimeout(0))
		if p.ctr != nil {
			h.pods = append(h.pods, p)
		}
	}
	if err := errors.Join(errs...); err != nil {
		h.fatalf("start pods: %v", err)
	}
	return pods
}

// request is the container of pod p.
func (h *harness) request(p *pod) testcontainers.GenericContainerRequest {
	tp := h.tp
	env := tp.podEnv(p.name)
	var mounts testcontainers.ContainerMounts
	for _, m := range tp.claims {
		mounts = append(mounts, testcontainers.ContainerMount{
			Source:   testcontainers.GenericVolumeMountSource{Name: p.volumes[m.claim]},
			Target:   testcontainers.ContainerMountTarget(m.mountPath),
			ReadOnly: m.readOnly,
		})
	}
	return testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:      h.image,
			Name:       p.name + "-" + h.runID,
			Entrypoint: expandAll(tp.command, env),
			Cmd:        expandAll(tp.args, env),
			Env:        env,
			Labels:     h.labels(union(tp.labels, map[string]string{"statefulset.kubernetes.io/pod-name": p.name})),
			// Kubernetes does not publish container ports on the node;
			// testcontainers publishes them (or, without any, the image's) on
			// ephemeral host ports, which the test does not use.
			ExposedPorts: tp.ports,
			Networks:     []string{h.netName},
			// The pod's DNS names: its own through the headless Service, and
			// the client Service's, which Docker resolves to every container
			// that has it. Unlike the Service, which routes only to Ready
			// pods, Docker's DNS includes containers that are still starting,
			// such as a joining pod itself when it resolves SHALE_JOIN.
			NetworkAliases: map[string][]string{h.netName: {p.name + "." + tp.serviceName, tp.clientService}},
			Mounts:         mounts,
			Tmpfs:          tp.tmpfs,
			WaitingFor:     h.startupWait(),
			ConfigModifier: func(c *container.Config) {
				c.Hostname = p.name
				c.User = tp.user
				if tp.workDir != "" {
					c.WorkingDir = tp.workDir
				}
			},
			HostConfigModifier: func(hc *container.HostConfig) {
				hc.NetworkMode = container.NetworkMode(h.netName)
				tp.hostCfg(hc)
				// Secret volumes: the test's directory, as the kubelet's
				// (read-only, updated in place).
				for _, m := range tp.secrets {
					hc.Binds = append(hc.Binds, h.secrets[m.secret].dir+":"+m.mountPath+":ro")
				}
			},
		},
		Started: true,
		Logger:  tclog.TestLogger(h.t),
	}
}

// startupWait is the pod's startup probe, if it has one.
func (h *harness) startupWait() wait.Strategy {
	if h.tp.startup == nil {
		return nil
	}
	return httpProbe{network: h.netName, probe: h.tp.startup, port: h.tp.startPort}
}

func union(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func (h *harness) removeVolume(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.docker.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
		h.t.Errorf("remove volume %s: %v", name, err)
	}
}

// checkNothingLeft fails the test if a container, network or volume of this
// run is still there.
func (h *harness) checkNothingLeft() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := make(client.Filters).Add("label", runLabel+"="+h.runID)
	var left []string
	cs, err := h.docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		h.t.Errorf("list containers: %v", err)
	}
	for _, c := range cs.Items {
		left = append(left, "container "+strings.Join(c.Names, ","))
	}
	ns, err := h.docker.NetworkList(ctx, client.NetworkListOptions{Filters: f})
	if err != nil {
		h.t.Errorf("list networks: %v", err)
	}
	for _, n := range ns.Items {
		left = append(left, "network "+n.Name)
	}
	vs, err := h.docker.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		h.t.Errorf("list volumes: %v", err)
	}
	for _, v := range vs.Items {
		left = append(left, "volume "+v.Name)
	}
	if len(left) > 0 {
		h.t.Errorf("left behind with label %s=%s: %s", runLabel, h.runID, strings.Join(left, ", "))
	}
}

// fatalf fails the test with the tail of every pod's log.
func (h *harness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("%s\n%s", fmt.Sprintf(format, args...), h.logs())
}

func (h *harness) logs() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	for _, p := range h.pods {
		state := "?"
		if s, err := p.ctr.State(ctx); err == nil {
			state = fmt.Sprintf("%s, exit code %d", s.Status, s.ExitCode)
		}
		fmt.Fprintf(&b, "--- %s (container %.12s, %s), last %d log lines:\n", p.name, p.ctr.GetContainerID(), state, logTail)
		rc, err := h.docker.ContainerLogs(ctx, p.ctr.GetContainerID(), client.ContainerLogsOptions{
			ShowStdout: true, ShowStderr: true, Tail: strconv.Itoa(logTail),
		})
		if err != nil {
			fmt.Fprintf(&b, "(logs: %v)\n", err)
			continue
		}
		var out bytes.Buffer
		_, err = stdcopy.StdCopy(&out, &out, rc)
		_ = rc.Close()
		b.Write(out.Bytes())
		if err != nil {
			fmt.Fprintf(&b, "(logs: %v)\n", err)
		}
	}
	return b.String()
}

// poll calls check until it returns nil, and fails the test with its last
// error if that does not happen within timeout.
func (h *harness) poll(ctx context.Context, timeout time.Duration, what string, check func(context.Context) error) {
	h.t.Helper()
	start := time.Now()
	for {
		err := check(ctx)
		if err == nil {
			return
		}
		if time.Since(start) > timeout || ctx.Err() != nil {
			h.fatalf("%s: not within %v: %v", what, timeout, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(pollInterval):
		}
	}
}

type execResult struct {
	code           int
	stdout, stderr string
}

// exec runs cmd in pod p, as kubectl exec does.
func (h *harness) exec(ctx context.Context, p *pod, timeout time.Duration, cmd []string) (execResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	code, r, err := p.ctr.Exec(ctx, cmd)
	if err != nil {
		return execResult{code: -1}, fmt.Errorf("exec %q in %s: %w", cmd, p.name, err)
	}
	var stdout, stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(&stdout, &stderr, r); err != nil {
		return execResult{code: -1}, fmt.Errorf("exec %q in %s: output: %w", cmd, p.name, err)
	}
	return execResult{code, stdout.String(), stderr.String()}, nil
}

// ctl runs the image's shalectl in pod p against endpoint; a non-zero exit
// is an error.
func (h *harness) ctl(ctx context.Context, p *pod, endpoint string, args ...string) (execResult, error) {
	cmd := append([]string{shalectl, "--endpoints", endpoint, "--timeout", ctlTimeout.String()}, args...)
	r, err := h.exec(ctx, p, ctlTimeout+15*time.Second, cmd)
	if err == nil && r.code != 0 {
		err = fmt.Errorf("shalectl %s in %s: exit %d: %s", strings.Join(cmd[1:], " "), p.name, r.code,
			strings.TrimSpace(r.stderr+"\n"+r.stdout))
	}
	return r, err
}

func (h *harness) status(ctx context.Context, p *pod, endpoint string) (*clusterStatus, error) {
	r, err := h.ctl(ctx, p, endpoint, "-o", "json", "cluster", "status")
	if err != nil {
		return nil, err
	}
	var s clusterStatus
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		return nil, fmt.Errorf("cluster status -o json: %v\n%s", err, r.stdout)
	}
	return &s, nil
}

// getValue reads key in pod p through endpoint and compares it with want.
func (h *harness) getValue(ctx context.Context, p *pod, endpoint, key, want string) error {
	r, err := h.ctl(ctx, p, endpoint, "-o", "json", "kv", "get", key)
	if err != nil {
		return err
	}
	var kv struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &kv); err != nil {
		return fmt.Errorf("kv get -o json: %v\n%s", err, r.stdout)
	}
	if kv.Key != key || kv.Value != want {
		return fmt.Errorf("kv get %s through %s in %s = %q: %q; want %q", key, endpoint, p.name, kv.Key, kv.Value, want)
	}
	return nil
}

// jsonUint is a uint64 that shalectl's JSON writes as a string (protojson)
// or as a number.
type jsonUint uint64

func (u *jsonUint) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseUint(strings.Trim(string(b), `"`), 10, 64)
	*u = jsonUint(v)
	return err
}

// clusterStatus is the part of `shalectl cluster status -o json` (and of
// `node list -o json`, which has only the nodes) that the test reads.
type clusterStatus struct {
	ClusterID string        `json:"cluster_id"`
	Nodes     []nodeStatus  `json:"nodes"`
	Shards    []shardStatus `json:"shards"`
}

type nodeStatus struct {
	Node struct {
		NodeID  jsonUint `json:"node_id"`
		Address string   `json:"address"`
		Removed bool     `json:"removed"`
	} `json:"node"`
	Live        bool     `json:"live"`
	LeaderCount jsonUint `json:"leader_count"`
	Removed     bool     `json:"removed"`
}

type shardStatus struct {
	Descriptor struct {
		ShardID  jsonUint `json:"shard_id"`
		Retired  bool     `json:"retired"`
		Replicas []struct {
			NodeID jsonUint `json:"node_id"`
			Role   string   `json:"role"`
		} `json:"replicas"`
	} `json:"descriptor"`
	LeaderNodeID jsonUint `json:"leader_node_id"`
}

// members are the nodes not removed, by address.
func (s *clusterStatus) members() map[string]nodeStatus {
	m := map[string]nodeStatus{}
	for _, n := range s.Nodes {
		if !n.Removed && !n.Node.Removed {
			m[n.Node.Address] = n
		}
	}
	return m
}

func (s *clusterStatus) byID(id uint64) (nodeStatus, bool) {
	for _, n := range s.Nodes {
		if uint64(n.Node.NodeID) == id {
			return n, true
		}
	}
	return nodeStatus{}, false
}

// leads lists the shards node id leads.
func (s *clusterStatus) leads(id uint64) []uint64 {
	var out []uint64
	for _, sh := range s.Shards {
		if uint64(sh.LeaderNodeID) == id && !sh.Descriptor.Retired {
			out = append(out, uint64(sh.Descriptor.ShardID))
		}
	}
	return out
}

func (sh *shardStatus) hasVoter(id uint64) bool {
	for _, r := range sh.Descriptor.Replicas {
		if uint64(r.NodeID) == id && !strings.Contains(r.Role, "LEARNER") {
			return true
		}
	}
	return false
}

// checkNodes: the cluster's members are exactly the nodes at addrs, all live.
func (s *clusterStatus) checkNodes(addrs []string) error {
	m := s.members()
	var problems []string
	for _, a := range addrs {
		n, ok := m[a]
		switch {
		case !ok:
			problems = append(problems, a+" is not a member")
		case !n.Live:
			problems = append(problems, fmt.Sprintf("node %d (%s) is not live", n.Node.NodeID, a))
		}
	}
	for a := range m {
		if !slices.Contains(addrs, a) {
			problems = append(problems, "unexpected member "+a)
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// check: checkNodes, and the cluster has shards, each with a leader.
func (s *clusterStatus) check(addrs []string) error {
	if err := s.checkNodes(addrs); err != nil {
		return err
	}
	if len(s.Shards) == 0 {
		return errors.New("no shards")
	}
	for _, sh := range s.Shards {
		if !sh.Descriptor.Retired && sh.LeaderNodeID == 0 {
			return fmt.Errorf("shard %d has no leader", sh.Descriptor.ShardID)
		}
	}
	return nil
}
