// Package k8s holds the tests of the Kubernetes manifests in this directory:
// the kustomize base (base/) and its overlays (overlays/dev, overlays/prod)
// are rendered with kustomize, every object is decoded strictly into its
// Kubernetes API type, and the Shale-specific wiring (founding cluster,
// probes, preStop hook, security context, storage) is checked.
package k8s
