// Package k8s holds the tests of the Kubernetes manifests in this directory:
// the kustomize base (base/) and its overlays (overlays/dev, overlays/prod)
// are rendered with kustomize, every object is decoded strictly into its
// Kubernetes API type, and the Shale-specific wiring (founding cluster,
// probes, preStop hook, security context, storage, and TLS in the prod
// overlay) is checked, as are the example cert-manager objects
// (cert-manager/) and the certificate commands of README.md against it.
// TestContainerStatefulSet runs the dev and prod overlays' pods in Docker,
// the prod ones with TLS from a Secret volume the test makes.
package k8s
