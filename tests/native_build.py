"""Building the C/C++ side from the tests: a fresh configure, build and install of luminav into a
prefix, and CMake projects built against such a prefix (test_cmake_install.py,
test_torch_adapter.py).

Each call prints its command; a failure raises with the command and the end of its output.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def jobs() -> str:
    """Build processes: $CMAKE_BUILD_PARALLEL_LEVEL, else one per core."""
    return os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)


def generator() -> List[str]:
    return ["-G", "Ninja"] if shutil.which("ninja") else []


def run(cmd: Sequence[str], *, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
        timeout: float = 1200) -> subprocess.CompletedProcess:
    cmd = [str(c) for c in cmd]
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=timeout)
    if out.returncode != 0:
        tail = "\n".join(out.stdout.splitlines()[-40:])
        raise AssertionError(f"{' '.join(cmd)} exited with {out.returncode}:\n{tail}")
    return out


def install_luminav(build: str, prefix: str, *defines: str) -> str:
    """A fresh configure, build and install of luminav (no tests, no examples) from this
    checkout into ``prefix``; returns ``prefix``."""
    run(["cmake", "-S", ROOT, "-B", build, *generator(), "-DCMAKE_BUILD_TYPE=Release",
         "-DLUMINAV_BUILD_TESTS=OFF", "-DLUMINAV_BUILD_EXAMPLES=OFF",
         f"-DCMAKE_INSTALL_PREFIX={prefix}", *defines])
    run(["cmake", "--build", build, "-j", jobs()])
    run(["cmake", "--install", build])
    return prefix


def build_project(source: str, build: str, prefix_path: Sequence[str], *defines: str) -> str:
    """Configures and builds the CMake project at ``source`` with CMAKE_PREFIX_PATH set to
    ``prefix_path`` (and nothing else of this checkout); returns ``build``."""
    run(["cmake", "-S", source, "-B", build, *generator(), "-DCMAKE_BUILD_TYPE=Release",
         "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", "-DCMAKE_PREFIX_PATH=" + ";".join(prefix_path),
         *defines])
    run(["cmake", "--build", build, "-j", jobs()])
    return build
