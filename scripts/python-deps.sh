#!/usr/bin/env bash
# Installs, from Debian's packages, what Shale's Python code needs: the
# runtime of the generated stubs and examples (python3-grpcio,
# python3-protobuf), pytest, and the generators `make proto` runs for Python
# (protoc and grpc_python_plugin, whose versions match the runtime's, and
# the well-known types' .proto files that protoc imports, in libprotobuf-dev),
# what `pip install ./clients/python` needs without PyPI (venv, pip,
# setuptools and wheel) and mypy, which clients/python/tests/test_packaging.py
# use.
# Does nothing when all of it is there. Runs apt-get as root, or through
# sudo.
set -euo pipefail

python=/usr/bin/python3
packages=(python3-grpcio python3-protobuf python3-pytest protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
	python3-venv python3-pip python3-setuptools python3-wheel python3-mypy)

have_all() {
	[ -x "$python" ] &&
		"$python" -c 'import grpc, google.protobuf, pytest' 2>/dev/null &&
		"$python" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("venv", "ensurepip", "pip", "setuptools", "wheel", "mypy")))' 2>/dev/null &&
		command -v protoc >/dev/null &&
		command -v grpc_python_plugin >/dev/null &&
		[ -f /usr/include/google/protobuf/any.proto ]
}

if have_all; then
	exit 0
fi
if ! command -v apt-get >/dev/null; then
	echo "python-deps: apt-get not found; install ${packages[*]} (Debian names) by hand" >&2
	exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
	sudo=(sudo)
fi
echo "python-deps: apt-get install ${packages[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q >/dev/null
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null
have_all || { echo "python-deps: still missing after apt-get install" >&2; exit 1; }
