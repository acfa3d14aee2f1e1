"""Command line: ``python -m lazytensor cache info|clear``.

>>> main(["cache", "info"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lazytensor", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cache_cmd = sub.add_parser("cache", help="show or clear the on-disk kernel cache")
    cache_cmd.add_argument("action", choices=["info", "clear"])
    cache_cmd.add_argument("--json", action="store_true", help="print info as JSON")
    args = parser.parse_args(argv)

    from .cache import default_cache

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


if __name__ == "__main__":
    sys.exit(main())
