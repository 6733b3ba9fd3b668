package grafana

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// serviceMonitor is the part of prometheus-operator's ServiceMonitor
// (monitoring.coreos.com/v1) that the checks read.
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port      string `json:"port"`
			Path      string `json:"path"`
			Scheme    string `json:"scheme"`
			TLSConfig *struct {
				ServerName string `json:"serverName"`
			} `json:"tlsConfig"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type scrapeFile struct {
	ScrapeConfigs []struct {
		JobName             string           `json:"job_name"`
		KubernetesSDConfigs []map[string]any `json:"kubernetes_sd_configs"`
		RelabelConfigs      []struct {
			SourceLabels []string `json:"source_labels"`
			Regex        string   `json:"regex"`
			Action       string   `json:"action"`
			TargetLabel  string   `json:"target_label"`
		} `json:"relabel_configs"`
	} `json:"scrape_configs"`
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestScrapeConfigs checks the ServiceMonitors and the plain scrape
// configuration against the base manifests of deploy/k8s: they select the
// Service and pods the base makes, on its HTTP port and metrics path.
func TestScrapeConfigs(t *testing.T) {
	base := filepath.Join("..", "k8s", "base")
	var svc corev1.Service
	readYAML(t, filepath.Join(base, "service-client.yaml"), &svc)
	var sts appsv1.StatefulSet
	readYAML(t, filepath.Join(base, "statefulset.yaml"), &sts)
	pod := sts.Spec.Template
	metricsPath := pod.Annotations["prometheus.io/path"]
	if metricsPath == "" {
		t.Fatal("the StatefulSet's pods have no prometheus.io/path annotation")
	}
	podPorts := map[string]bool{}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			podPorts[p.Name] = true
		}
	}
	svcPorts := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		svcPorts[p.Name] = true
	}

	for file, scheme := range map[string]string{"servicemonitor.yaml": "http", "servicemonitor-tls.yaml": "https"} {
		var sm serviceMonitor
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &sm); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if sm.APIVersion != "monitoring.coreos.com/v1" || sm.Kind != "ServiceMonitor" {
			t.Errorf("%s: %s %s, want a monitoring.coreos.com/v1 ServiceMonitor", file, sm.APIVersion, sm.Kind)
		}
		if len(sm.Spec.Selector.MatchLabels) == 0 {
			t.Errorf("%s: selects no Service", file)
		}
		for k, v := range sm.Spec.Selector.MatchLabels {
			if svc.Labels[k] != v {
				t.Errorf("%s: selects %s=%s, which Service %s does not carry", file, k, v, svc.Name)
			}
		}
		if len(sm.Spec.Endpoints) == 0 {
			t.Errorf("%s: no endpoints", file)
		}
		for _, e := range sm.Spec.Endpoints {
			if !svcPorts[e.Port] || !podPorts[e.Port] {
				t.Errorf("%s: port %q is not a named port of Service %s and of the pods", file, e.Port, svc.Name)
			}
			if e.Path != metricsPath {
				t.Errorf("%s: path %q, the pods serve %q", file, e.Path, metricsPath)
			}
			if e.Scheme != scheme {
				t.Errorf("%s: scheme %q, want %q", file, e.Scheme, scheme)
			}
			if (scheme == "https") != (e.TLSConfig != nil) {
				t.Errorf("%s: tlsConfig %+v with scheme %s", file, e.TLSConfig, e.Scheme)
			}
		}
	}

	var sc scrapeFile
	b, err := os.ReadFile("prometheus-scrape.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &sc); err != nil {
		t.Fatalf("prometheus-scrape.yaml: %v", err)
	}
	if len(sc.ScrapeConfigs) != 1 || sc.ScrapeConfigs[0].JobName == "" || len(sc.ScrapeConfigs[0].KubernetesSDConfigs) == 0 {
		t.Fatalf("prometheus-scrape.yaml: want one job with kubernetes_sd_configs, have %+v", sc)
	}
	kept := map[string]bool{}
	for _, r := range sc.ScrapeConfigs[0].RelabelConfigs {
		if r.Action != "keep" || len(r.SourceLabels) != 1 {
			continue
		}
		re := regexp.MustCompile("^(?:" + r.Regex + ")$")
		var value string
		switch src := r.SourceLabels[0]; src {
		case "__meta_kubernetes_pod_label_app_kubernetes_io_name":
			value = pod.Labels["app.kubernetes.io/name"]
		case "__meta_kubernetes_pod_annotation_prometheus_io_scrape":
			value = pod.Annotations["prometheus.io/scrape"]
		case "__meta_kubernetes_pod_container_port_name":
			for name := range podPorts {
				if re.MatchString(name) {
					value = name
				}
			}
		default:
			t.Errorf("prometheus-scrape.yaml: keeps on %s, which the test does not know", src)
			continue
		}
		if !re.MatchString(value) {
			t.Errorf("prometheus-scrape.yaml: keeps %s =~ %q, but the pods have %q", r.SourceLabels[0], r.Regex, value)
		}
		kept[r.SourceLabels[0]] = true
	}
	for _, src := range []string{"__meta_kubernetes_pod_label_app_kubernetes_io_name", "__meta_kubernetes_pod_container_port_name"} {
		if !kept[src] {
			t.Errorf("prometheus-scrape.yaml: no keep on %s (the job would scrape other pods or ports)", src)
		}
	}
}
