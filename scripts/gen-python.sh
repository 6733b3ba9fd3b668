#!/usr/bin/env bash
# Generates the Python code of proto/shale/v1 (messages, type stubs, gRPC
# services) and of clients/python/proto (the wire-compatible google.rpc
# messages) into OUT/shale/... with Debian's protoc and grpc_python_plugin
# (scripts/python-deps.sh installs them). `make proto` runs it with
# OUT=clients/python; `make proto-check` into a temporary directory.
set -euo pipefail

out=${1:?usage: gen-python.sh OUT}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
cd "$root"
with_services=(shale/v1/admin.proto shale/v1/auth.proto shale/v1/kv.proto shale/v1/raft.proto)
messages_only=(shale/v1/meta.proto shale/rpc/status.proto)
protoc -I proto -I clients/python/proto --python_out="$out" --pyi_out="$out" \
	--grpc_python_out="$out" --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" \
	"${with_services[@]}"
protoc -I proto -I clients/python/proto --python_out="$out" --pyi_out="$out" "${messages_only[@]}"
