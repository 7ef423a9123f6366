"""`cmake --install` of the C/C++ package, and programs that know luminav only through it.

A fresh configure, build and install from this checkout into a temporary prefix (the session
fixture ``luminav_prefix``), then: the installed tree holds the public headers and nothing that
reaches src/; libluminav exports the C API and the marked C++ symbols only; examples/cpp, a CMake
project of its own, builds against the prefix with find_package(luminav CONFIG) and trains; a C
program compiles and runs with `pkg-config --cflags --libs luminav`; the version file refuses
another major version; the static build (LUMINAV_BUILD_SHARED=OFF) serves the same example.

Marker ``slow``: the fresh builds take a few minutes on two cores.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import textwrap

import pytest

from native_build import ROOT, build_project, install_luminav, run

pytestmark = pytest.mark.slow

with open(os.path.join(ROOT, "VERSION"), encoding="utf-8") as _f:
    VERSION = _f.read().strip()
MAJOR = VERSION.split(".")[0]

PUBLIC_HEADER_DIRS = [os.path.join(ROOT, "optimizer", "luminav-triton-aot", "include", "luminav"),
                      os.path.join(ROOT, "optimizer", "luminav", "include", "luminav")]
# Headers that need a third-party library to compile (tested where that library is:
# test_torch_adapter.py builds torch.hpp against the torch wheel's libtorch).
NEEDS_OTHERS = {"torch.hpp"}


def _lib(prefix: str) -> str:
    found = [d for d in ("lib", "lib64") if os.path.isdir(os.path.join(prefix, d))]
    assert found, f"no lib/ under {prefix}: {os.listdir(prefix)}"
    return os.path.join(prefix, found[0])


def test_the_prefix_holds_the_package(luminav_prefix):
    lib = _lib(luminav_prefix)
    for rel in ("bin/luminav", f"{os.path.basename(lib)}/libluminav.so",
                f"{os.path.basename(lib)}/libluminav.so.{MAJOR}",
                f"{os.path.basename(lib)}/libluminav.so.{VERSION}",
                f"{os.path.basename(lib)}/cmake/luminav/luminavConfig.cmake",
                f"{os.path.basename(lib)}/cmake/luminav/luminavConfigVersion.cmake",
                f"{os.path.basename(lib)}/cmake/luminav/luminavTargets.cmake",
                f"{os.path.basename(lib)}/pkgconfig/luminav.pc"):
        assert os.path.exists(os.path.join(luminav_prefix, rel)), rel
    out = run([os.path.join(luminav_prefix, "bin", "luminav"), "version"])
    assert f"luminav {VERSION}" in out.stdout


def test_only_public_headers_install_and_none_reaches_src(luminav_prefix):
    installed_dir = os.path.join(luminav_prefix, "include", "luminav")
    installed = sorted(os.listdir(installed_dir))
    public = sorted(name for d in PUBLIC_HEADER_DIRS for name in os.listdir(d))
    assert installed == public
    assert {"luminav.h", "luminav.hpp", "error.h", "cuda_driver.h", "torch.hpp"} <= set(installed)
    assert not glob.glob(os.path.join(luminav_prefix, "include", "**", "*engine*"), recursive=True)
    for name in installed:
        with open(os.path.join(installed_dir, name), encoding="utf-8") as f:
            for line in f:
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if m:  # every quoted include is another installed header
                    assert m.group(1).startswith("luminav/"), (name, line)
                    assert os.path.basename(m.group(1)) in installed, (name, line)


@pytest.mark.parametrize("header", ["luminav.h", "luminav.hpp", "error.h", "cuda_driver.h"])
def test_each_installed_header_compiles_on_its_own(luminav_prefix, header, tmp_path):
    include = os.path.join(luminav_prefix, "include")
    src = tmp_path / "one.cpp"
    src.write_text(f'#include "luminav/{header}"\nint main() {{ return 0; }}\n')
    run(["c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I", include,
         str(src)])
    if header == "luminav.h":  # the C API is C
        c = tmp_path / "one.c"
        c.write_text('#include "luminav/luminav.h"\nint main(void) { return 0; }\n')
        run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", "-I",
             include, str(c)])


def test_the_shared_library_exports_the_api_only(luminav_prefix):
    lib = os.path.join(_lib(luminav_prefix), f"libluminav.so.{VERSION}")
    out = run(["nm", "-D", "--defined-only", "-C", lib]).stdout
    names = [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]
    c_api = [n for n in names if n.startswith("lv_")]
    assert {"lv_api_version", "lv_optimizer_create", "lv_optimizer_step",
            "lv_optimizer_export_state"} <= set(c_api)
    others = [n for n in names if not n.startswith("lv_")]
    stray = [n for n in others if not re.match(r"(typeinfo (name )?for |vtable for )?luminav::", n)]
    assert not stray, f"libluminav exports symbols outside its API: {stray[:10]}"
    assert any(n.startswith("luminav::cuda_driver()") for n in others)


def test_examples_cpp_builds_against_the_installed_prefix_and_trains(luminav_prefix, tmp_path):
    # A copy outside the checkout: the project can only find luminav through the prefix.
    source = tmp_path / "examples_cpp"
    shutil.copytree(os.path.join(ROOT, "examples", "cpp"), source)
    build = build_project(str(source), str(tmp_path / "build"), [luminav_prefix])
    exe = os.path.join(build, "luminav_train_logreg")
    deps = run(["ldd", exe]).stdout
    assert os.path.join(_lib(luminav_prefix), "libluminav.so") in deps, deps
    out = run([exe, "--epochs", "4", "--checkpoint-epoch", "2", "--checkpoint",
               str(tmp_path / "ckpt")], cwd=str(tmp_path))
    assert "resumed run EQUALS the uninterrupted run bitwise" in out.stdout
    losses = [float(x) for x in re.findall(r"epoch +\d+ +loss ([0-9.]+)\n", out.stdout)]
    assert len(losses) == 4 and losses[-1] < losses[0], out.stdout


C_PROGRAM = textwrap.dedent("""\
    /* A C program on the C API: one float32 parameter, a few CPU steps. */
    #include <stdio.h>
    #include "luminav/luminav.h"

    static int fail(lv_status s) { fprintf(stderr, "%s: %s\\n", lv_status_string(s), lv_last_error()); return 1; }

    int main(void) {
      float w[4] = {1, -1, 0.5f, 2}, g[4] = {0.1f, -0.2f, 0.3f, -0.4f};
      lv_optimizer_options o; lv_hyperparams h; lv_param_desc d; lv_optimizer* opt = NULL;
      lv_status s;
      if ((s = lv_optimizer_options_init(&o)) || (s = lv_hyperparams_init(&h)) || (s = lv_param_desc_init(&d))) return fail(s);
      o.num_threads = 1; o.seed = 7; h.lr = 0.01;
      d.data = w; d.dtype = LV_DTYPE_FLOAT32; d.grad = g; d.grad_dtype = LV_DTYPE_FLOAT32; d.numel = 4;
      if ((s = lv_optimizer_create(&o, &opt)) || (s = lv_optimizer_add_group(opt, &h, NULL)) ||
          (s = lv_optimizer_add_param(opt, 0, &d, NULL))) return fail(s);
      for (int i = 0; i < 3; ++i) if ((s = lv_optimizer_step(opt, NULL))) return fail(s);
      int64_t step = 0;
      if ((s = lv_optimizer_get_param_step(opt, 0, &step))) return fail(s);
      printf("luminav %s api %u step %lld w0 %.6f\\n", lv_version_string(), lv_api_version(), (long long)step, w[0]);
      s = lv_optimizer_step(NULL, NULL);  /* refused, with a message */
      printf("null handle: %s\\n", lv_status_string(s));
      return lv_optimizer_destroy(opt) == LV_STATUS_OK ? 0 : 1;
    }
    """)


def test_a_c_program_builds_with_pkg_config(luminav_prefix, tmp_path):
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(_lib(luminav_prefix), "pkgconfig"))
    assert run(["pkg-config", "--modversion", "luminav"], env=env).stdout.strip() == VERSION
    flags = run(["pkg-config", "--cflags", "--libs", "luminav"], env=env).stdout.split()
    includes = [os.path.normpath(f[2:]) for f in flags if f.startswith("-I")]
    assert os.path.join(luminav_prefix, "include") in includes, flags  # found from the .pc's place
    src = tmp_path / "use_luminav.c"
    src.write_text(C_PROGRAM)
    exe = tmp_path / "use_luminav"
    run(["cc", "-std=c99", "-Wall", "-Werror", str(src), "-o", str(exe), *flags])
    out = run([str(exe)], env=dict(os.environ, LD_LIBRARY_PATH=_lib(luminav_prefix)))
    m = re.search(r"luminav (\S+) api (\d+) step (\d+) w0 (\S+)", out.stdout)
    assert m, out.stdout
    assert m.group(1) == VERSION and m.group(3) == "3"
    assert float(m.group(4)) < 1.0  # a positive gradient moved w[0] down
    assert "null handle: LV_STATUS_INVALID_ARGUMENT" in out.stdout


def _find_package(prefix: str, version: str, tmp_path) -> str:
    src = tmp_path / f"probe-{version}"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(textwrap.dedent(f"""\
        cmake_minimum_required(VERSION 3.18)
        project(probe LANGUAGES CXX)
        find_package(luminav {version} CONFIG QUIET)
        message(STATUS "probe: found=${{luminav_FOUND}} version=${{luminav_VERSION}} shared=${{luminav_SHARED}} exe=${{luminav_EXECUTABLE}}")
        """))
    out = run(["cmake", "-S", str(src), "-B", str(tmp_path / f"probe-build-{version}"),
               f"-DCMAKE_PREFIX_PATH={prefix}"]).stdout
    return re.search(r"probe: (.*)", out).group(1)


def test_the_version_file_accepts_the_same_major_only(luminav_prefix, tmp_path):
    ok = _find_package(luminav_prefix, VERSION, tmp_path)
    assert f"found=1 version={VERSION} shared=ON" in ok
    assert ok.endswith(os.path.join(luminav_prefix, "bin", "luminav"))
    newer_major = f"{int(MAJOR) + 1}.0"
    assert "found=0" in _find_package(luminav_prefix, newer_major, tmp_path)


def test_the_static_library_serves_the_same_example(tmp_path):
    prefix = install_luminav(str(tmp_path / "build-static"), str(tmp_path / "prefix-static"),
                             "-DLUMINAV_BUILD_SHARED=OFF")
    lib = _lib(prefix)
    assert os.path.isfile(os.path.join(lib, "libluminav.a"))
    assert not glob.glob(os.path.join(lib, "libluminav.so*"))
    build = build_project(os.path.join(ROOT, "examples", "cpp"), str(tmp_path / "build-example"),
                          [prefix])
    exe = os.path.join(build, "luminav_train_logreg")
    assert "libluminav" not in subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    out = run([exe, "--epochs", "3", "--checkpoint-epoch", "1", "--checkpoint",
               str(tmp_path / "ckpt")], cwd=str(tmp_path))
    assert "resumed run EQUALS the uninterrupted run bitwise" in out.stdout
    pc = open(os.path.join(lib, "pkgconfig", "luminav.pc"), encoding="utf-8").read()
    assert re.search(r"^Libs: .*-lluminav .*-lcrypto", pc, re.M), pc
