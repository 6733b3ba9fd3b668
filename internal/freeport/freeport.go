// Package freeport picks free loopback TCP ports for test and benchmark
// clusters.
package freeport

import (
	"fmt"
	"net"
)

// Ports returns n distinct TCP ports that were free on 127.0.0.1. Every
// listener stays open until all n are picked (a port closed at once can be
// handed out again by the next pick), then all are closed for the caller
// to bind; another process may take one in between, so callers retry on
// "address already in use".
func Ports(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("freeport: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
