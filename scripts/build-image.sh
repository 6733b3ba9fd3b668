#!/usr/bin/env bash
# build-image.sh [TAG] builds the Shale container image (default shale:dev)
# FROM scratch: shale-server and shalectl built static (CGO_ENABLED=0), a
# passwd entry for the non-root user shale (65532) and the data directory
# /var/lib/shale owned by it. Nothing is pulled. Needs Go and a Docker engine.
set -euo pipefail

tag="${1:-shale:dev}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT

mkdir -p "$ctx/rootfs/usr/local/bin" "$ctx/rootfs/etc" "$ctx/data"
(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' \
	-o "$ctx/rootfs/usr/local/bin/" ./cmd/shale-server ./cmd/shalectl)
printf 'root:x:0:0:root:/:/sbin/nologin\nshale:x:65532:65532:shale:/var/lib/shale:/sbin/nologin\n' >"$ctx/rootfs/etc/passwd"
printf 'root:x:0:\nshale:x:65532:\n' >"$ctx/rootfs/etc/group"
chmod 0755 "$ctx/rootfs/usr/local/bin/"*
chmod 0700 "$ctx/data"
cp "$root/deploy/docker/Dockerfile" "$ctx/Dockerfile"

rev="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
# The classic builder when BuildKit (docker buildx) is not installed.
if ! docker buildx version >/dev/null 2>&1; then
	export DOCKER_BUILDKIT=0
fi
docker build --quiet --label "org.opencontainers.image.revision=$rev" \
	--label "org.opencontainers.image.source=https://github.com/shale-db/shale" \
	-t "$tag" "$ctx" >/dev/null
echo "build-image: built $tag (revision $rev)"
