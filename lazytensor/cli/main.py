"""Command line: ``python -m lazytensor doctor`` and ``python -m lazytensor cache info|clear``.

Without a command it prints this help.

>>> main(["cache", "info"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lazytensor",
        description="lazytensor's command line: check this machine, show or clear the kernel cache.",
        epilog="Examples: `python -m lazytensor doctor` (what works here and how to fix what "
               "does not), `python -m lazytensor cache info`.")
    sub = parser.add_subparsers(dest="command", metavar="command")
    doctor_cmd = sub.add_parser(
        "doctor", help="check the compiler, OpenMP/SIMD, the kernel cache, CUDA; say how to fix",
        description="Check what lazytensor needs on this machine: the C++ compiler, OpenMP and "
                    "SIMD (a timed test compile), one real kernel, the kernel cache, and for "
                    "CUDA nvcc, pycuda, the driver and the GPUs. Exit status 1 when the CPU "
                    "backend cannot work.")
    doctor_cmd.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor_cmd.add_argument("--no-kernel", action="store_true",
                            help="skip building and running a real kernel")
    cache_cmd = sub.add_parser("cache", help="show or clear the on-disk kernel cache")
    cache_cmd.add_argument("action", choices=["info", "clear"])
    cache_cmd.add_argument("--json", action="store_true", help="print info as JSON")
    return parser


def _doctor(args) -> int:
    from . import doctor

    checks = doctor.run_checks(kernel=not args.no_kernel)
    if args.json:
        print(json.dumps(doctor.as_dicts(checks), indent=2))
    else:
        print(doctor.report(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0


def _cache(args) -> int:
    from ..cache import default_cache

    cache = default_cache()
    if args.action == "clear":
        n = cache.clear()
        print(f"removed {n} kernels from {cache.root}")
        return 0
    info = cache.info()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"cache directory: {info['root']}{' (fallback)' if info.get('fallback') else ''}")
    print(f"kernels: {info['num_entries']}, {info['total_bytes'] / 1e6:.1f} MB")
    for e in info["entries"][:50]:
        extra = e.get("extra", {})
        print(f"  {e['key'][:16]}  {e['size'] / 1e3:8.1f} kB  {extra.get('dtype', ''):8s} "
              f"{extra.get('reduction', ''):14s} {extra.get('formula', '')}")
    if info["num_entries"] > 50:
        print(f"  ... and {info['num_entries'] - 50} more")
    return 0


def main(argv=None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "doctor":
        return _doctor(args)
    return _cache(args)

