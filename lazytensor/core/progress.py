"""Progress on long work: the ``lazytensor`` logger, compile notices, solver iterations.

Notices go through the standard :mod:`logging` logger ``"lazytensor"``:

- INFO: a kernel whose first compile took more than :data:`SLOW_COMPILE_S` seconds (later
  calls, and later runs, load it from the disk cache);
- DEBUG: every compile, with its time.

By default the logger shows INFO. ``LAZYTENSOR_VERBOSE=0`` silences it (WARNING),
``LAZYTENSOR_VERBOSE=1`` shows DEBUG as well; ``logging.getLogger("lazytensor").setLevel(...)``
does the same from Python. While the application has not configured logging (the root
logger has no handler), notices are written to stderr as ``[lazytensor] ...`` lines; once
it has, they only propagate to its handlers.

:class:`IterationProgress` reports an iterative solver's iterations and residual: a tqdm
bar when tqdm is installed, plain lines otherwise.

>>> import io
>>> out = io.StringIO()
>>> bar = IterationProgress("solve", eps=1e-6, file=out, use_tqdm=False)
>>> bar.update(1, 0.5); bar.close(1, 1e-7, converged=True)
>>> print(out.getvalue().strip())
solve: iteration 1, relative residual 5.00e-01 (target 1e-06)
solve: converged after 1 iteration, relative residual 1.00e-07 (target 1e-06)
"""

from __future__ import annotations

import logging
import os
import sys
from typing import IO

logger = logging.getLogger("lazytensor")

SLOW_COMPILE_S = 1.0  # a first compile slower than this gets an INFO notice
ENV_VAR = "LAZYTENSOR_VERBOSE"


class _StderrUntilConfigured(logging.StreamHandler):
    """stderr, but only while the root logger has no handler of its own (the application
    has not configured logging); otherwise the record reaches the application's handlers
    by propagation and printing it here would show it twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        self.stream = sys.stderr  # the current one (notebooks and tests replace it)
        super().emit(record)


def _level_from_env() -> int:
    value = os.environ.get(ENV_VAR, "").strip()
    if value in ("", "default"):
        return logging.INFO
    if value in ("0", "false", "no", "off"):
        return logging.WARNING
    return logging.DEBUG


def _install() -> None:
    if not any(isinstance(h, _StderrUntilConfigured) for h in logger.handlers):
        handler = _StderrUntilConfigured()
        handler.setFormatter(logging.Formatter("[lazytensor] %(message)s"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:  # leave a level the application chose
        logger.setLevel(_level_from_env())


_install()


def compile_notice(what: str, seconds: float, width: int = 72) -> None:
    """Log that the kernel ``what`` (cut to ``width`` characters) was compiled in ``seconds``:
    INFO when slower than :data:`SLOW_COMPILE_S`, else DEBUG.

    >>> compile_notice("float32 sum of exp(-sqdist(x, y))", 0.01)  # DEBUG: silent by default
    """
    if len(what) > width:
        what = what[: width - 1] + "…"
    level = logging.INFO if seconds > SLOW_COMPILE_S else logging.DEBUG
    logger.log(level, "compiled a kernel in %.1f s (kept in the kernel cache; later calls "
               "load it): %s", seconds, what)


class IterationProgress:
    """Iterations and relative residual of a solver, on ``file`` (default stderr).

    With tqdm installed (and ``use_tqdm`` not False) a tqdm counter whose postfix is the
    residual; otherwise a line at iteration 1, every ``every`` iterations, and at the end.
    """

    def __init__(self, name: str, eps: float, file: IO[str] | None = None,
                 use_tqdm: bool | None = None, every: int = 10):
        self.name, self.eps, self.every = name, eps, every
        self.file = file if file is not None else sys.stderr
        self.bar = None
        if use_tqdm is not False:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(desc=name, unit="it", file=self.file, leave=True,
                                dynamic_ncols=False, ncols=90)
            elif use_tqdm:
                raise ImportError("IterationProgress(use_tqdm=True) needs tqdm (pip install tqdm)")

    def update(self, iteration: int, residual: float) -> None:
        """Report that ``iteration`` finished with relative residual ``residual``."""
        if self.bar is not None:
            self.bar.update(iteration - self.bar.n)
            self.bar.set_postfix_str(f"residual {residual:.2e} (target {self.eps:.0e})",
                                     refresh=False)
        elif iteration == 1 or iteration % self.every == 0:
            print(f"{self.name}: iteration {iteration}, relative residual {residual:.2e} "
                  f"(target {self.eps:.0e})", file=self.file, flush=True)

    def close(self, iteration: int, residual: float, converged: bool) -> None:
        """The final line: converged or stopped, after how many iterations."""
        if self.bar is not None:
            self.bar.update(iteration - self.bar.n)
            self.bar.set_postfix_str(f"residual {residual:.2e} (target {self.eps:.0e})",
                                     refresh=False)
            self.bar.close()
            return
        word = "converged" if converged else "stopped"
        plural = "" if iteration == 1 else "s"
        print(f"{self.name}: {word} after {iteration} iteration{plural}, relative residual "
              f"{residual:.2e} (target {self.eps:.0e})", file=self.file, flush=True)
