//go:build !linux

package cluster

// evictCache does nothing outside Linux.
func evictCache(string) {}
