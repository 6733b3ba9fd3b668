// Package lint holds the repository's lint checks, written as ordinary Go
// tests so that `go test ./...` (and therefore `make test` and CI) enforces
// them on any machine with nothing but Go installed:
//
//   - the one-way import direction between layers (docs/architecture.md,
//     "Import direction": storage < replication < placement < server <
//     cmd; client and proto on the side), and that benchmark peers such as Pebble never enter the
//     main module;
//   - that storage's leaf packages never import the storage root package;
//   - that every exported identifier under storage/ has a doc comment;
//   - that production code under storage/ panics only on documented
//     invariants (a `// invariant:` comment on or just above the line);
//   - that every Go file is gofmt-formatted;
//   - that the Markdown docs do not drift: every relative link (and its
//     #anchor) resolves, and README's layout table names every top-level
//     folder. (cmd/shalectl's own tests check the shalectl command lines
//     the docs show.)
//
// The package has no non-test code besides this comment.
package lint
