// Package directfile writes new files that are written once, start to end,
// and not read back soon: received snapshot files, backup copies.
//
// Where the file system takes them (Linux: O_DIRECT), a Writer gathers the
// bytes in an aligned buffer and writes whole buffers straight to the disk,
// so the bytes never pass through the page cache. That spares the kernel
// allocating, zeroing and copying a page-cache page per 4 KiB — on a virtual
// machine whose fresh pages cost a fault on the host, most of a buffered
// writer's CPU — and keeps a large copy from evicting what the process has
// cached. Elsewhere (tmpfs, other systems) a Writer writes through the page
// cache. Either way, a file is complete and durable once Sync returns.
package directfile
