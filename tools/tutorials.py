"""Run the tutorials: each notebook of tutorials/ in a fresh kernel, from a clean state.

``python -m tools.tutorials [--write] [--timeout S] [NAME ...]`` (``make tutorials``)

Each notebook runs in a new Jupyter kernel, in tutorials/, with a new and empty kernel
cache (a temporary directory, removed afterwards, as is every temporary file the
notebook makes), so that every kernel is compiled as it would be for a new user. An
error in any cell fails the notebook, and the command exits with status 1. ``--write``
saves the executed notebooks back (outputs and figures, streams tidied), for committing;
without it the files are left untouched, which is what CI runs. ``--check-saved`` only
checks the saved notebooks (every code cell executed in order, no error output, figures
present) without running them.

>>> nb = new_notebook(["print('a\\\\rb')"])
>>> problems(nb)[0]
'cell 1 was not executed (no execution count)'
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tutorials"


def notebooks(names: list | None = None) -> list:
    """The tutorials' paths, sorted; ``names`` picks some (by file name or its start)."""
    found = sorted(ROOT.glob("*.ipynb"))
    if not names:
        return found
    picked = [p for p in found if any(p.name.startswith(n) or p.stem == n for n in names)]
    missing = [n for n in names if not any(p.name.startswith(n) or p.stem == n for p in found)]
    if missing:
        raise SystemExit(f"no tutorial named {', '.join(missing)} in {ROOT}")
    return picked


def new_notebook(sources: list):
    """A notebook with one code cell per source string (used by the tests)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def execute(nb, workdir: Path, timeout: float = 600):
    """Run every cell of ``nb`` in a fresh kernel in ``workdir`` with an empty kernel cache.

    Raises ``nbclient.exceptions.CellExecutionError`` at the first failing cell.
    """
    import nbclient

    saved = {k: os.environ.get(k) for k in ("LAZYTENSOR_CACHE_DIR", "TMPDIR")}
    scratch = tempfile.mkdtemp(prefix="lazytensor-tutorial-")
    try:
        os.environ["LAZYTENSOR_CACHE_DIR"] = os.path.join(scratch, "kernel-cache")
        os.environ["TMPDIR"] = scratch  # the kernel process inherits both
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                         record_timing=False,
                                         resources={"metadata": {"path": str(workdir)}})
        client.execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(scratch, ignore_errors=True)
    return nb


_OVERWRITTEN = re.compile(r"[^\n]*\r(?=[^\n])")  # a line a carriage return wrote over


def tidy(nb):
    """Merge consecutive stream outputs of a cell and keep what a terminal would show of
    progress bars (text overwritten by a carriage return is dropped)."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        merged = []
        for out in cell.get("outputs", []):
            if (out.get("output_type") == "stream" and merged
                    and merged[-1].get("output_type") == "stream"
                    and merged[-1]["name"] == out["name"]):
                merged[-1]["text"] += out["text"]
            else:
                merged.append(out)
        for out in merged:
            if out.get("output_type") == "stream":
                out["text"] = _OVERWRITTEN.sub("", out["text"]).replace("\r\n", "\n")
                out["text"] = out["text"].replace("\r", "")
        cell["outputs"] = merged
    return nb


def problems(nb) -> list:
    """What is wrong with a saved notebook: a code cell not executed, or out of order, an
    error output, or no figure at all."""
    found = []
    count = 0
    figures = 0
    for k, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        if cell.get("execution_count") is None:
            found.append(f"cell {k} was not executed (no execution count)")
        elif cell["execution_count"] != count + 1:
            found.append(f"cell {k} ran as number {cell['execution_count']}, not {count + 1}: "
                         "run the notebook from the top in a fresh kernel")
        count = cell.get("execution_count") or count + 1
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append(f"cell {k} has an error output: {out.get('ename')}: "
                             f"{out.get('evalue')}")
            if "image/png" in out.get("data", {}):
                figures += 1
    if not found and figures == 0:
        found.append("no figure in the saved outputs")
    return found


def _figures(nb) -> int:
    return sum("image/png" in out.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for out in c.get("outputs", []))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.tutorials",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="notebooks to run (default: all); e.g. 03")
    p.add_argument("--write", action="store_true", help="save the executed notebooks")
    p.add_argument("--check-saved", action="store_true",
                   help="only check the saved notebooks, without running them")
    p.add_argument("--timeout", type=float, default=600, help="seconds a cell may take")
    args = p.parse_args(argv)
    import nbformat

    failed = []
    started = time.perf_counter()
    for path in notebooks(args.names):
        nb = nbformat.read(path, as_version=4)
        if args.check_saved:
            issues = problems(nb)
            print(f"{path.name}: " + ("; ".join(issues) if issues else "ok"))
            failed += [path.name] if issues else []
            continue
        t0 = time.perf_counter()
        try:
            execute(nb, path.parent, args.timeout)
        except Exception as error:  # noqa: BLE001 - reported per notebook, then exit 1
            print(f"{path.name}: FAILED after {time.perf_counter() - t0:.1f} s\n{error}",
                  flush=True)
            failed.append(path.name)
            continue
        cells = sum(c.cell_type == "code" for c in nb.cells)
        print(f"{path.name}: {time.perf_counter() - t0:.1f} s, {cells} code cells, "
              f"{_figures(nb)} figures", flush=True)
        if args.write:
            nbformat.write(tidy(nb), path)
    total = time.perf_counter() - started
    print(f"{'failed: ' + ', '.join(failed) if failed else 'all ok'} ({total:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
