package freeport

import (
	"fmt"
	"net"
	"testing"
)

// TestPortsDistinctAndFree: the ports are distinct and can be bound.
func TestPortsDistinctAndFree(t *testing.T) {
	for range 20 {
		ports, err := Ports(8)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		var ls []net.Listener
		for _, p := range ports {
			if seen[p] {
				t.Fatalf("port %d picked twice in %v", p, ports)
			}
			seen[p] = true
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				t.Fatalf("bind port %d: %v", p, err)
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
	}
}
