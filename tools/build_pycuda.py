"""Build (once) and install pycuda, linked against the fake driver when no driver exists.

pycuda is published as a source archive only, and links against ``libcuda.so``. On a
machine without the NVIDIA driver (CI), the fake driver of ``tests/cuda_emulator`` (every
function of ``cuda.h``, soname ``libcuda.so.1``) serves as the link target: at run time
the process loads whichever ``libcuda.so.1`` it finds first -- the real driver on a GPU
machine, the fake one in the tests. The wheel is cached under ``build/wheels``.

    python -m tools.build_pycuda                 # build if needed, install into this python
    python -m tools.build_pycuda --python ~/.pyenv/versions/3.12.1/bin/python --no-install \
        --out build/gpu-wheels
        # a cp312 wheel and its dependencies' wheels, to carry to a GPU machine offline

Without nvcc (no toolkit headers to build against) it prints why and does nothing.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION = "2026.1"
DEPS = ["pytools", "mako", "platformdirs", "siphash24", "typing_extensions", "markupsafe"]


def _tag(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print(f'cp{sys.version_info[0]}"
                          "{sys.version_info[1]}')"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def build_wheel(python: str, out: Path) -> Path:
    """The pycuda wheel for ``python`` (built if not in ``out``)."""
    tag = _tag(python)
    found = sorted(glob.glob(str(out / f"pycuda-{VERSION}-{tag}-*.whl")))
    if found:
        return Path(found[-1])
    sys.path.insert(0, str(ROOT / "tests"))
    from cuda_emulator import build_driver, cuda_include

    include = cuda_include()
    driver = build_driver()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pycuda-build-") as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", "pycuda", f"pycuda=={VERSION}", "-d", str(tmp)],
                       check=True)
        archive = next(tmp.glob("pycuda-*.tar.gz"))
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # Python < 3.11.4; an archive from the package index we asked for
                tar.extractall(tmp)
        src = next(p for p in tmp.iterdir() if p.is_dir())
        cuda_root = include.parent
        (src / "siteconf.py").write_text(
            f"CUDA_ROOT = {str(cuda_root)!r}\nCUDA_INC_DIR = [{str(include)!r}]\n"
            "CUDA_ENABLE_GL = False\nCUDA_ENABLE_CURAND = False\n"
            f"CUDADRV_LIB_DIR = [{str(driver.parent)!r}]\nCUDADRV_LIBNAME = ['cuda']\n"
            "CXXFLAGS = []\nLDFLAGS = []\n")
        env = dict(os.environ, PATH=f"{cuda_root / 'bin'}{os.pathsep}{os.environ['PATH']}")
        has_build_deps = subprocess.run(
            [python, "-c", "import numpy, setuptools, wheel"], capture_output=True).returncode == 0
        isolation = ["--no-build-isolation"] if has_build_deps else []
        subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, str(src),
                        "-w", str(tmp / "dist")], check=True, env=env)
        wheel = next((tmp / "dist").glob("pycuda-*.whl"))
        final = out / wheel.name
        shutil.copy(wheel, final)
    return final


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the interpreter to build for")
    ap.add_argument("--out", default=str(ROOT / "build" / "wheels"), type=Path)
    ap.add_argument("--no-install", action="store_true",
                    help="only build; also download the dependencies' wheels")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from lazytensor.codegen.cuda.nvcc import nvcc_path

    if nvcc_path() is None:
        print("pycuda not built: nvcc (the CUDA toolkit) is not installed, and pycuda "
              "builds against its headers; the CUDA runtime tests will be skipped")
        return 0
    wheel = build_wheel(args.python, args.out)
    if args.no_install:
        subprocess.run([args.python, "-m", "pip", "download", "-q", "--only-binary=:all:",
                        "-d", str(args.out), *DEPS], check=True)
        print(wheel)
        return 0
    subprocess.run([args.python, "-m", "pip", "install", "-q", str(wheel)], check=True)
    print(f"installed {wheel.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
