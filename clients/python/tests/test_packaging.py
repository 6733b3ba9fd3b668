"""`pip install ./clients/python` works on top of Debian's python3-grpcio and
python3-protobuf, without PyPI: a virtual environment that sees the system's
packages, pip without build isolation (setuptools from the system) and
without an index (the dependencies are satisfied by Debian's)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

PKG = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL")}
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{' '.join(args)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_pip_install_on_debian_packages(tmp_path: Path) -> None:
    missing = [m for m in ("venv", "ensurepip", "pip", "setuptools", "wheel") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"{sys.executable} lacks {', '.join(missing)}: run scripts/python-deps.sh (make python-deps)")
    # A copy, so that the build leaves nothing in the work tree.
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--system-site-packages", str(venv), cwd=tmp_path)
    py = str(venv / "bin" / "python")
    out = run(py, "-m", "pip", "install", "--no-build-isolation", "--no-index", str(src), cwd=tmp_path)
    assert "Successfully installed shale-" in out
    # Imported from the virtual environment, not from the source tree.
    code = (
        "import shale, shale.v1.kv_pb2, shale.v1.kv_pb2_grpc, shale.rpc.status_pb2, importlib.metadata as m;"
        "print(shale.__file__);"
        "print(sorted(m.requires('shale')));"
        "print(m.version('grpcio'), m.version('protobuf'))"
    )
    lines = run(py, "-c", code, cwd=tmp_path).splitlines()
    assert lines[0].startswith(str(venv)), lines
    # (Metadata-Version 2.1 writes "name (spec)".)
    assert lines[1].replace(" (", "").replace(")", "") == "['grpcio<2,>=1.51', 'protobuf<6,>=4.21']", lines
    # The dependencies were satisfied by what the system has (Debian's).
    grpc_v, pb_v = (tuple(int(x) for x in v.split(".")[:2]) for v in lines[2].split())
    assert grpc_v >= (1, 51) and pb_v >= (4, 21), lines
    site = Path(lines[0]).parent
    for f in ("py.typed", "client.py", "aio.py", "_core.py", "_watch.py", "errors.py", "types.py", "v1/kv_pb2.pyi", "rpc/status_pb2.pyi"):
        assert (site / f).is_file(), f


@pytest.mark.parametrize("python_version", [None, "3.9"])
def test_mypy_strict(python_version: Optional[str]) -> None:
    """The hand-written modules type-check with mypy --strict (the settings
    are pyproject.toml's [tool.mypy]; Debian's python3-mypy): for the
    running Python, and for the oldest one pyproject.toml admits (3.9:
    mypy then checks against that version's syntax and standard library;
    the tests themselves run only on the machine's Python)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.fail(f"{sys.executable} lacks mypy: run scripts/python-deps.sh (make python-deps)")
    args = ["--python-version", python_version] if python_version else []
    out = run(sys.executable, "-m", "mypy", "--cache-dir", os.devnull, *args, cwd=PKG)
    assert "Success: no issues found" in out, out
