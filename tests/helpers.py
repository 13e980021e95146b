"""Shared test helpers: corpus makers, fault-injecting decoders, thread checks."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import soundfile as sf

from audiobuffer import DecodeError, WorkItem

#: Seconds a test waits for threads to finish before it calls them leaked.
JOIN_TIMEOUT = 10.0

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AUDIOBUFFER_SHARED", REPO.parent / "shared"))
FSDD = SHARED / "data" / "fsdd" / "recordings"
AUDIO_FORMATS = SHARED / "data" / "audio_formats"


def audiobuffer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("audiobuffer-")]


def wait_no_threads(timeout: float = JOIN_TIMEOUT) -> list[str]:
    """Wait up to ``timeout`` for every audiobuffer thread to end; return the names still alive."""
    deadline = time.monotonic() + timeout
    for thread in audiobuffer_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in audiobuffer_threads()]


def wait_until_blocked(cond: threading.Condition, n: int = 1, timeout: float = JOIN_TIMEOUT) -> bool:
    """Wait up to ``timeout`` until at least ``n`` threads wait on ``cond``; whether they did.

    A blocked thread signals nothing, so this polls the private ``Condition._waiters`` (CPython), in
    steps of 1 ms: tests use it to know that a producer or consumer is stuck before acting on it.
    """
    deadline = time.monotonic() + timeout
    while len(cond._waiters) < n:  # type: ignore[attr-defined]
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def open_descriptors(under: Path) -> int:
    """How many of this process's descriptors are open on files under ``under`` (Linux: /proc/self/fd).

    Counting every descriptor of the process would be flaky: another test's may close at any time,
    when the garbage collector gets to it.
    """
    found, root = 0, os.path.realpath(under)
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}").startswith(root)
        except OSError:  # closed meanwhile (the one listdir itself used, for one)
            pass
    return found


def write_tone(path: Path, *, seconds: float = 0.5, sample_rate: int = 16000, channels: int = 1,
               freq: float = 440.0, subtype: str | None = None) -> Path:
    """Write a sine tone (channel c at freq * (c + 1)) and return its path."""
    t = np.arange(round(seconds * sample_rate)) / sample_rate
    data = np.stack([0.5 * np.sin(2 * np.pi * freq * (c + 1) * t) for c in range(channels)], axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, data.astype(np.float32), sample_rate, subtype=subtype)
    return path


def drop_flac_length(path: Path) -> Path:
    """Zero the total-samples field of FLAC file ``path``'s STREAMINFO (the low 36 bits of bytes 18-25),
    as streaming encoders write it: the length is then unknown until the file is decoded."""
    data = bytearray(path.read_bytes())
    data[18:26] = (int.from_bytes(data[18:26], "big") & ~((1 << 36) - 1)).to_bytes(8, "big")
    path.write_bytes(bytes(data))
    return path


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A smooth ``(height, width, 3)`` uint8 picture with structure everywhere (gradients, waves),
    as JPEG compresses photos."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    phase = np.random.default_rng(seed).uniform(0, 6)
    pixels = np.stack([x * 255 / width, y * 255 / height,
                       128 + 100 * np.sin(x / 17 + y / 29 + phase)], axis=-1)
    return pixels.round().clip(0, 255).astype(np.uint8)


def make_corpus(root: Path, n: int, *, fmt: str = "wav", classes: int = 3, seconds: float = 0.1,
                sample_rate: int = 8000) -> list[Path]:
    """``n`` short tones named ``{label}_{i}.{fmt}`` in class folders ``class{label}/``."""
    paths = []
    for i in range(n):
        label = i % classes
        paths.append(write_tone(root / f"class{label}" / f"{label}_{i:04d}.{fmt}", seconds=seconds,
                                sample_rate=sample_rate, freq=200.0 + 50 * label))
    return paths


class IndexDecoder:
    """A fast decoder whose sample is just the item's index and path (no file is read).

    Args:
        fail: indices whose decode raises ``exc_type``.
        delays: index -> seconds the decode of that item takes (simulated decode time).
        exc_type: the exception raised for failing items.
    """

    def __init__(self, fail: Iterable[int] = (), delays: Mapping[int, float] | None = None,
                 exc_type: type[Exception] = DecodeError) -> None:
        self.fail = set(fail)
        self.delays = dict(delays or {})
        self.exc_type = exc_type

    def __call__(self, item: WorkItem) -> dict[str, Any]:
        import torch  # here, not at the top: the tests that need no torch import this module too

        delay = self.delays.get(item.index)
        if delay:
            time.sleep(delay)  # stands for the decode time of a slow file
        if item.index in self.fail:
            raise self.exc_type(f"injected failure on item {item.index}")
        return {"index": item.index, "path": item.path, "seq": item.seq,
                "audio": torch.full((4,), float(item.index))}


def fake_paths(n: int) -> list[str]:
    return [f"/nonexistent/item_{i:05d}.wav" for i in range(n)]


def duration_manifest(folder: Path, durations: Iterable[float], name: str = "manifest.csv") -> Path:
    """A CSV manifest of :func:`fake_paths` (no file behind them) with their durations in a ``seconds``
    column, for batches by duration (``duration_column="seconds"``) with a decoder that reads no file."""
    seconds = [float(d) for d in durations]
    rows = "".join(f"{path},{d!r}\n" for path, d in zip(fake_paths(len(seconds)), seconds))
    path = folder / name
    path.write_text("path,seconds\n" + rows, encoding="utf-8")
    return path


def import_script(path: Path) -> Any:
    """A script of scripts/ imported as a module (torch is loaded already in a test process, so a
    training script's import sets no OMP_WAIT_POLICY here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def command_state_kept() -> Iterator[None]:
    """What a command run in this process changes for the rest of it, as it was after: torch's
    intra-op thread count and CPU random state (where torch is loaded already) and the SIGCHLD
    handler, which DataLoader's workers set (where the OS has one)."""
    import signal

    torch = sys.modules.get("torch")
    sigchld = getattr(signal, "SIGCHLD", None)
    handler = signal.getsignal(sigchld) if sigchld is not None else None
    threads = torch.get_num_threads() if torch is not None else None
    try:
        with torch.random.fork_rng(devices=[]) if torch is not None else contextlib.nullcontext():
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(threads)
        if sigchld is not None:
            signal.signal(sigchld, handler)


def run_script_here(script: Any, *args: object, cwd: Path,
                    env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a training script (:func:`import_script`) in this process as its command line does:
    its ``train`` under its ``script_main`` (the exit status, a library error said in one line),
    in ``cwd``, with ``env`` set and one torch thread, as OMP_NUM_THREADS=1 gives a command. Its
    exit status and output; torch's thread count, random state, deterministic mode and cudnn
    benchmark flag, the environment and the SIGINT handler are put back. A run spares a start
    of torch (seconds)."""
    import signal

    import pytest
    import torch

    out, err = io.StringIO(), io.StringIO()
    handler = signal.getsignal(signal.SIGINT)
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled(),
                     torch.backends.cudnn.benchmark)
    argv = ["--threads", "1", *map(str, args)]
    name = Path(script.__file__).stem
    environ = dict(os.environ)  # the script may set variables (--deterministic sets cuBLAS's)
    try:
        with pytest.MonkeyPatch.context() as patch, command_state_kept():
            patch.chdir(cwd)
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)  # unset, as in a fresh process
            for key, value in (env or {}).items():
                patch.setenv(key, value)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                    pytest.raises(SystemExit) as ended:
                script.script_main(name, lambda: script.train(argv))
    finally:
        os.environ.clear()
        os.environ.update(environ)
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.benchmark = deterministic[2]
        signal.signal(signal.SIGINT, handler)
    code = ended.value.code
    return subprocess.CompletedProcess(argv, 0 if code is None else code, out.getvalue(),
                                       err.getvalue())


def run_torchrun(script: Path, *args: object, nproc: int = 2, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``script`` (a file in tests/) under ``torchrun --standalone --nproc_per_node=nproc``, with the
    tests folder importable and one intra-op thread per rank; the result, output captured."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                             str(script), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # The ranks are the launcher's children: killing the launcher alone leaves them waiting on its store.
        import psutil

        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class ScriptedTuner:
    """A stand-in for ``ProducerTuner`` that answers from a script, for ``ProducerPool(tuner=...)``.

    The first count is the start; each observation takes the next one (the last repeats). Every
    observation is due, so the count can change after each chunk or item the consumer takes.
    """

    def __init__(self, counts: Iterable[int]) -> None:
        self.counts = list(counts)
        self.count = self.counts[0]
        self.observed = 0
        self.history: list[tuple[float, int, str]] = []

    def due(self, now: float) -> bool:
        return True

    def observe(self, sample: Any) -> int:
        count = self.counts[min(self.observed, len(self.counts) - 1)]
        self.observed += 1
        if count != self.count or not self.history:
            self.history.append((sample.time, count, "scripted"))
        self.count = count
        return count


def windows_text_files(monkeypatch: Any) -> None:
    """Make text files behave as on Windows for the rest of a test: ``open``, ``io.open`` (and so
    ``Path.write_text``, ``os.fdopen``) write ``\\r\\n`` for ``\\n`` unless given ``newline=``, and use
    the locale's cp1252 when given no ``encoding=``. Binary files are untouched."""
    import builtins
    import io

    real_open = io.open

    def windows_open(file: Any, mode: str = "r", buffering: int = -1, encoding: str | None = None,
                     errors: str | None = None, newline: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if "b" not in mode:
            if encoding in (None, "locale"):
                encoding = "cp1252"
            if newline is None and any(c in mode for c in "wax+"):
                newline = "\r\n"
        return real_open(file, mode, buffering, encoding, errors, newline, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", windows_open)
    monkeypatch.setattr(io, "open", windows_open)


def wait_gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` has ended (a zombie counts) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)  # polling another process's existence: there is nothing to wait on
    return False


def segment_exists(name: str) -> bool:
    """Whether the shared-memory segment ``name`` is still on the system, looked up by name (every OS)."""
    from audiobuffer.loaders.isolated import shm as _shm

    try:
        segment = _shm.attach(name)
    except FileNotFoundError:
        return False
    segment.close()
    return True


def table_descriptors(pid: int | str = "self") -> set[str]:
    """The descriptors process ``pid`` holds open to an item table's region (Linux; empty elsewhere), as
    ``<fd> -> <target>``: an IsolatedLoader holds one until it closes, its helper one it inherited."""
    folder = Path(f"/proc/{pid}/fd")
    found = set()
    if folder.is_dir():
        for fd in folder.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:  # closed since the listing
                continue
            if "audiobuffer-table-" in target:
                found.add(f"{fd.name} -> {target}")
    return found


def mapped_segments(pid: int | str = "self") -> dict[str, int]:
    """The shared-memory segments process ``pid`` maps (Linux; empty elsewhere): name -> bytes mapped.
    Named or not: a batch slot's name is gone from the system while its pages are mapped."""
    maps = Path(f"/proc/{pid}/maps")
    found: dict[str, int] = {}
    if maps.exists():
        for line in maps.read_text(encoding="utf-8").splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/ab_"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                name = fields[5].split()[0].rsplit("/", 1)[1]
                found[name] = found.get(name, 0) + end - start
    return found


@contextlib.contextmanager
def isolated_leftovers(monkeypatch: Any) -> Iterator[None]:
    """Fail unless the isolated loaders run inside leave no child process and no shared-memory segment.

    Segments are checked through the names the loader created: each one the trainer attached must be
    gone (looked up by name, on every OS), and where the system lists segments (Linux), so must every
    one named after one of those helper processes (``ab_<pid>_...``: a slot it grew unknown to the trainer).
    """
    from audiobuffer.loaders.isolated import shm as _shm

    attach = _shm.attach
    seen: set[str] = set()

    def recording_attach(name: str, **kwargs: Any) -> Any:
        seen.add(name)
        return attach(name, **kwargs)

    monkeypatch.setattr(_shm, "attach", recording_attach)
    # Children from before (multiprocessing's resource tracker, once some test used spawn) stay.
    older = {p.pid for p in psutil.Process().children(recursive=True)}
    tables = table_descriptors()  # item tables shared with a helper (held by an open loader)
    yield
    monkeypatch.setattr(_shm, "attach", attach)
    gc.collect()  # a loader left unclosed lets go of its table's descriptor when it is collected
    left_tables = table_descriptors() - tables
    assert not left_tables, f"item-table descriptors left open: {sorted(left_tables)}"
    deadline = time.monotonic() + JOIN_TIMEOUT
    children = [p for p in psutil.Process().children(recursive=True) if p.pid not in older]
    _, alive = psutil.wait_procs(children, timeout=max(0.0, deadline - time.monotonic()))
    assert not alive, f"child processes left: {[p.pid for p in alive]}"
    helpers = {int(name.split("_")[1]) for name in seen}
    left = {name for name in seen if segment_exists(name)}
    left.update(name for pid in helpers for name in _shm.leftovers(pid))
    assert not left, f"shared-memory segments left: {sorted(left)}"


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A tar shard at ``path`` of ``members`` (name, bytes), in that order."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def drain(dataset: Any) -> list[dict]:
    """Every sample of a ``BufferedDataset``'s epoch, then close it: no producer thread is left."""
    samples = list(dataset)
    dataset.close()
    assert wait_no_threads() == []
    return samples
