"""The command line run in the test's own process: ``cli("run", config, ...)`` as ``python -m
audiobuffer run config ...`` would run, without the two seconds a new process takes to import
torch."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator

import pytest
from helpers import command_state_kept

#: The warning filters of a plain ``python`` process (no -W, no PYTHONWARNINGS), last to first as
#: ``warnings.filterwarnings`` inserts them: what ``python -m audiobuffer`` shows, not pytest's
#: filters.
_PROCESS_FILTERS = (
    ("ignore", ResourceWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", DeprecationWarning, ""),
    ("default", DeprecationWarning, "__main__"),
)


@contextlib.contextmanager
def _cwd(path: str | os.PathLike[str] | None) -> Iterator[None]:
    before = os.getcwd()
    if path is not None:
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _process_warnings(stderr: io.TextIOBase) -> Iterator[None]:
    """Warnings as a fresh process shows them: its filters, none hidden because an earlier test
    showed it (entering ``catch_warnings`` starts each module's registry afresh), printed to
    ``stderr`` through ``warnings.formatwarning`` (which ``main`` sets), not recorded by pytest."""

    def show(message, category, filename, lineno, file=None, line=None):
        stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    once = dict(warnings.onceregistry)
    warnings.onceregistry.clear()
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in _PROCESS_FILTERS:
                warnings.filterwarnings(action, category=category, module=module)
            warnings.showwarning = show  # restored by catch_warnings
            yield
    finally:
        warnings.onceregistry.clear()
        warnings.onceregistry.update(once)


@contextlib.contextmanager
def _bare_root_logger() -> Iterator[None]:
    """The root logger without handlers, as in a fresh process, so that ``main``'s own
    ``logging.basicConfig`` configures it (its handler writes to the redirected stderr); pytest's
    handlers and the level are put back after, and the handler ``main`` added is closed."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()
    try:
        yield
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def run_in_process(*args: object, cwd: str | os.PathLike[str] | None = None
                   ) -> subprocess.CompletedProcess:
    """``audiobuffer *args`` run by ``audiobuffer.cli.main.main`` here, in directory ``cwd``: its
    exit status and what it wrote to stdout and stderr, as ``subprocess.run(..., text=True)``
    returns them.

    stdout and stderr are text streams over bytes (UTF-8, strict), as a redirected process's are.
    An exception ``main`` lets through is raised here, traceback and all, where a process would
    print it.
    """
    from audiobuffer.cli.main import main

    argv = [str(arg) for arg in args]
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    with contextlib.ExitStack() as stack:
        stack.enter_context(command_state_kept())
        stack.enter_context(_cwd(cwd))
        stack.enter_context(contextlib.redirect_stdout(stdout))
        stack.enter_context(contextlib.redirect_stderr(stderr))
        stack.enter_context(_process_warnings(stderr))
        stack.enter_context(_bare_root_logger())
        try:
            status = main(argv)
        except SystemExit as exit_:  # argparse: a bad argument (2), --help and --version (0)
            code = exit_.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
            status = code or 0
    outputs = []
    for stream in (stdout, stderr):
        stream.flush()
        outputs.append(stream.buffer.getvalue().decode("utf-8"))
    return subprocess.CompletedProcess(["audiobuffer", *argv], status, *outputs)


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess]:
    """:func:`run_in_process`: ``cli("run", config, "--json", "-", cwd=folder)``."""
    return run_in_process


def run_process(*args: object, cwd: str | os.PathLike[str] | None = None,
                env: dict[str, str] | None = None, timeout: float = 240
                ) -> subprocess.CompletedProcess:
    """``python -m audiobuffer *args`` in a new process (for tests whose subject is the process
    itself)."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "audiobuffer", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


@pytest.fixture
def cli_process() -> Callable[..., subprocess.CompletedProcess]:
    """:func:`run_process`: ``cli_process("run", config, cwd=folder)``, in a new process."""
    return run_process

