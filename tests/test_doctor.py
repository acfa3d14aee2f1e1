"""``python -m lazytensor doctor`` and the command line without arguments."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from lazytensor.cache import KernelCache

from lazytensor.backends.cpu import doctor as cpu_doctor
from lazytensor.cli import doctor

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                               reason="no C++ compiler on this machine")


def _cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "lazytensor", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def _by_name(checks):
    return {c.name: c for c in checks}


def test_no_arguments_prints_help():
    out = _cli()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m lazytensor")
    assert "doctor" in out.stdout and "cache" in out.stdout


def _simd_of_compiler(path):
    """The SIMD level the compiler's own predefined macros give under -march=native."""
    macros = subprocess.run([path, "-march=native", "-dM", "-E", "-x", "c++", "-"],
                            input="", capture_output=True, text=True, check=True).stdout
    for macro, name in (("__AVX512F__", "AVX-512"), ("__AVX2__", "AVX2"), ("__AVX__", "AVX"),
                        ("__SSE4_2__", "SSE4.2"), ("__ARM_FEATURE_SVE", "SVE"),
                        ("__ARM_NEON", "NEON")):
        if f"#define {macro} " in macros:
            return name
    return "none"


@needs_cxx
def test_doctor_reports_compiler_openmp_simd_and_a_checked_kernel(monkeypatch, tmp_path):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("LAZYTENSOR_NUM_THREADS", "2")
    monkeypatch.setenv("LAZYTENSOR_CACHE_DIR", str(tmp_path / "cache"))
    checks = _by_name(doctor.run_checks())
    compiler = checks["C++ compiler"]
    assert compiler.status == "ok"
    path = compiler.detail.split(" (")[0]
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    assert version.splitlines()[0].strip() in compiler.detail
    assert checks["test compile"].status == "ok"
    assert re.match(r"\d+\.\d\d s ", checks["test compile"].detail)
    threads = int(checks["OpenMP"].detail.split(" threads")[0])
    assert threads >= 1 and "kernels use 2" in checks["OpenMP"].detail
    assert checks["SIMD"].detail.startswith(_simd_of_compiler(path))
    kernel = checks["first kernel"]
    assert kernel.status == "ok", kernel.detail
    assert float(kernel.detail.split("relative error vs NumPy ")[1]) < 1e-10
    # the doctor's kernel went to a temporary cache, not to the user's
    assert not (tmp_path / "cache").exists()
    assert "not created yet" in checks["kernel cache"].detail


def test_cache_location_size_and_count(monkeypatch, tmp_path):
    root = tmp_path / "cache"
    monkeypatch.setenv("LAZYTENSOR_CACHE_DIR", str(root))
    cache = KernelCache(root)
    for k in range(3):
        cache.get_or_build(f"{k:064x}", lambda d: (d / "kernel.so").write_bytes(b"x" * 50_000)
                           and {})
    check = doctor.check_cache()
    assert check.status == "ok"
    assert str(root) in check.detail and "$LAZYTENSOR_CACHE_DIR" in check.detail
    assert "mode 0700" in check.detail and "3 kernels" in check.detail
    number, unit = re.search(r"([\d.]+) (kB|MB)", check.detail).groups()
    size = float(number) * (1e3 if unit == "kB" else 1e6)
    assert 150e3 <= size < 160e3 + 50e3  # 3 x 50 kB of binaries, their meta.json; rounding


def test_a_world_writable_cache_is_reported_with_the_fix(monkeypatch, tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("LAZYTENSOR_CACHE_DIR", str(root))
    check = doctor.check_cache()
    assert check.status == "warn" and "writable" in check.detail
    assert check.fix == f"chmod 700 {root}"


def test_no_compiler_fails_with_the_fix(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env.update(PATH=str(empty), LAZYTENSOR_CACHE_DIR=str(tmp_path / "cache"))
    out = _cli("doctor", env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    failing = [line for line in lines if line.lstrip().startswith("FAIL")]
    assert len(failing) == 1 and "C++ compiler" in failing[0] and "g++" in failing[0]
    fix = lines[lines.index(failing[0]) + 1]
    assert "fix: install a C++ compiler" in fix and "apt-get install g++" in fix
    assert "not run (no C++ compiler)" in out.stdout
    assert "CPU backend: NOT ready (C++ compiler)" in out.stdout


def test_cxx_naming_nothing_runnable_fails_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "missing-c++"))
    check, compiler = cpu_doctor.check_compiler()
    assert compiler is None and check.status == "fail"
    assert "$CXX" in check.detail and "missing-c++" in check.detail
    assert check.fix == "fix or unset $CXX"


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
def test_cxx_as_a_command_is_reported_as_given(monkeypatch):
    monkeypatch.setenv("CXX", "g++ -Wall")
    check, compiler = cpu_doctor.check_compiler()
    assert check.status == "ok" and compiler is not None
    assert check.detail.startswith(shlex.join([shutil.which("g++"), "-Wall"]) + " ($CXX) (")


def test_cuda_parts_match_what_is_installed(monkeypatch):
    from lazytensor.codegen.cuda.nvcc import nvcc_path

    checks = _by_name(doctor.run_checks(kernel=False))
    nvcc = nvcc_path()
    assert (checks["nvcc"].status == "ok") == (nvcc is not None)
    if nvcc is None:
        assert "CUDA toolkit" in checks["nvcc"].fix
    else:
        assert checks["nvcc"].detail.startswith(nvcc)
    torch = pytest.importorskip("torch")
    gpu = checks["GPU"]
    assert (gpu.status == "ok") == torch.cuda.is_available()
    if gpu.status != "ok":
        assert gpu.fix
    summary = doctor.summary(list(checks.values()))
    assert ("CUDA backend: ready" in summary) == all(
        checks[n].status == "ok" for n in ("nvcc", "pycuda", "NVIDIA driver", "GPU"))


@needs_cxx
def test_json_output(tmp_path):
    env = dict(os.environ, LAZYTENSOR_CACHE_DIR=str(tmp_path / "cache"))
    out = _cli("doctor", "--json", "--no-kernel", env=env)
    assert out.returncode == 0, out.stderr
    checks = json.loads(out.stdout)
    assert [c["name"] for c in checks][:4] == ["C++ compiler", "test compile", "OpenMP", "SIMD"]
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in checks)
    assert all(c["status"] in doctor.STATUSES for c in checks)
