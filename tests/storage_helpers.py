"""Test helpers for remote storage: an S3 server on loopback (moto) and a fault-injecting HTTP proxy.

Everything listens on 127.0.0.1 only, every loop is bounded by a stop event and socket timeouts, and
``stop()`` joins every thread it started (the proxy's threads are named ``audiobuffer-test-proxy*``,
so the autouse thread check of ``conftest.py`` also sees that they ended).
"""

from __future__ import annotations

import logging
import re
import socket
import struct
import threading
from collections.abc import Container
from pathlib import Path

from helpers import JOIN_TIMEOUT

from audiobuffer.sources.storage import Retry

#: Seconds a proxy socket waits for its peer before it gives the connection up.
SOCKET_TIMEOUT = 5.0
KEY = SECRET = "testing"
REGION = "us-east-1"
#: The bucket the ``s3`` fixture (conftest.py) makes.
BUCKET = "audio"
#: Retries in tests: quick, so that a test of giving up takes a fraction of a second.
FAST = Retry(attempts=3, base_delay=0.01, max_delay=0.02)
#: The statuses a FaultProxy can answer with, and their reason phrases.
_REASONS = {"500": "Internal Server Error", "503": "Service Unavailable", "403": "Forbidden"}


class MotoS3:
    """moto's S3 server in a thread on 127.0.0.1 at a free port, and a boto3 client for setting up data."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request in the test output
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.host, self.port = self._server.get_host_and_port()
        self.endpoint = f"http://{self.host}:{self.port}"
        import boto3

        self.client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY,
                                   aws_secret_access_key=SECRET, region_name=REGION)

    def options(self, endpoint: str | None = None) -> dict:
        """fsspec storage options for this server (or for ``endpoint``, a proxy in front of it)."""
        return {"endpoint_url": endpoint or self.endpoint, "key": KEY, "secret": SECRET,
                "client_kwargs": {"region_name": REGION}}

    def make_bucket(self, bucket: str) -> None:
        self.client.create_bucket(Bucket=bucket)

    def upload_dir(self, local: Path, bucket: str, prefix: str) -> str:
        """Upload the files of ``local`` under ``s3://bucket/prefix/``; return that URL."""
        for path in sorted(Path(local).iterdir()):
            if path.is_file():
                self.client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
        return f"s3://{bucket}/{prefix}"

    def put(self, bucket: str, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def stop(self) -> None:
        """Stop the server (bounded: fails if it does not stop within JOIN_TIMEOUT)."""
        stopper = threading.Thread(target=self._server.stop, name="moto-stop", daemon=True)
        stopper.start()
        stopper.join(JOIN_TIMEOUT)
        if stopper.is_alive():
            raise RuntimeError(f"moto's server did not stop within {JOIN_TIMEOUT} s")


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 that forwards requests to ``upstream`` and fails chosen ones.

    Each client connection carries one request (the forwarded request says ``Connection: close``, so
    the response ends the connection and the client opens a new one for the next request). Requests
    are numbered from 1 in the order they arrive; those in ``faults`` fail as ``mode`` says:
    ``"500"`` (a ``500 Internal Server Error``), ``"503"`` (a ``503 Service Unavailable``), ``"403"``
    (a ``403 Forbidden``) or ``"reset"`` (the connection is reset without an answer). With ``shift``,
    every request for a byte range asks upstream for the range ``shift`` bytes further on: the answer
    has the length asked for, from the wrong offset.

    Attributes:
        requests: requests received so far.
        faulted: requests failed so far.
    """

    def __init__(self, upstream: tuple[str, int], *, faults: Container[int] = (), mode: str = "503",
                 shift: int = 0) -> None:
        if mode not in _REASONS and mode != "reset":
            raise ValueError(f"mode must be one of {sorted(_REASONS)} or 'reset', got {mode!r}")
        self.upstream = upstream
        self.faults = faults
        self.mode = mode
        self.shift = shift
        self.requests = 0
        self.faulted = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._handlers: list[threading.Thread] = []
        self._listener, self.port = _listen(0.1)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._acceptor = threading.Thread(target=self._accept_loop, name="audiobuffer-test-proxy", daemon=True)
        self._acceptor.start()

    def stop(self) -> None:
        """Stop accepting, close the listening socket and join every thread (bounded)."""
        self._stop.set()
        self._acceptor.join(JOIN_TIMEOUT)
        self._listener.close()
        with self._lock:
            handlers = list(self._handlers)
        for thread in handlers:
            thread.join(JOIN_TIMEOUT)
        alive = [t.name for t in [self._acceptor, *handlers] if t.is_alive()]
        if alive:
            raise RuntimeError(f"proxy threads still alive after {JOIN_TIMEOUT} s: {alive}")

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._handle, args=(conn,), name="audiobuffer-test-proxy-conn",
                                      daemon=True)
            with self._lock:
                self._handlers = [t for t in self._handlers if t.is_alive()]
                self._handlers.append(thread)
            thread.start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(SOCKET_TIMEOUT)
            try:
                request = _read_request(conn)
                if request is None:
                    return
                with self._lock:
                    self.requests += 1
                    fault = self.requests in self.faults
                    self.faulted += fault
                if fault and self.mode == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return  # closing with a zero linger sends a reset
                if fault:
                    reason = _REASONS[self.mode]
                    conn.sendall(f"HTTP/1.1 {self.mode} {reason}\r\nContent-Length: 0\r\n"
                                 f"Connection: close\r\n\r\n".encode())
                    return
                if self.shift:
                    request = _shift_range(request, self.shift)
                with socket.create_connection(self.upstream, timeout=SOCKET_TIMEOUT) as up:
                    up.sendall(request)
                    while not self._stop.is_set():
                        chunk = up.recv(65536)
                        if not chunk:
                            break
                        conn.sendall(chunk)
            except OSError:
                return  # the client went away, or the upstream: the client sees a closed connection


def _listen(poll: float) -> tuple[socket.socket, int]:
    """A socket listening on a free loopback port, and that port; its accept waits at most ``poll`` seconds,
    so that an accept loop checks its stop event that often."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(poll)
    return listener, listener.getsockname()[1]


def _shift_range(request: bytes, shift: int) -> bytes:
    """``request`` with its ``Range: bytes=A-B`` header moved ``shift`` bytes on."""
    def moved(match: re.Match[bytes]) -> bytes:
        start, end = int(match[2]) + shift, int(match[3]) + shift
        return match[1] + f"{start}-{end}".encode()

    head, _, body = request.partition(b"\r\n\r\n")
    head = re.sub(rb"(?im)^(range:\s*bytes=)(\d+)-(\d+)", moved, head)
    return head + b"\r\n\r\n" + body


def _read_request(conn: socket.socket) -> bytes | None:
    """One HTTP request from ``conn`` (head and a Content-Length body), rewritten to ``Connection: close``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
        if len(data) > 1 << 20:
            raise OSError("request head over 1 MiB")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    kept = [lines[0]]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        if name.strip().lower() in (b"connection", b"keep-alive"):
            continue
        kept.append(line)
    kept.append(b"Connection: close")
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return b"\r\n".join(kept) + b"\r\n\r\n" + body


class HttpFiles:
    """An HTTP server on 127.0.0.1 serving the files of ``root`` (GET and HEAD), one request per connection.

    A ``Range: bytes=a-b`` header gets a ``206`` with those bytes, unless ``ranges=False``: then the whole
    file comes with a ``200``, as from a server that ignores ranges. Its threads are named
    ``audiobuffer-test-http*``; ``stop()`` joins them (bounded).
    """

    def __init__(self, root: Path, *, ranges: bool = True) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        folder = Path(root)

        class Handler(BaseHTTPRequestHandler):
            timeout = SOCKET_TIMEOUT

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, *, body: bool) -> None:
                path = folder / self.path.lstrip("/").split("?", 1)[0]
                if not path.is_file() or folder not in path.resolve().parents:
                    self.send_error(404)
                    return
                data = path.read_bytes()
                wanted = self.headers.get("Range", "")
                status = 200
                if ranges and wanted.startswith("bytes="):
                    first, _, last = wanted[len("bytes="):].partition("-")
                    start, end = int(first), min(len(data), int(last) + 1) if last else len(data)
                    data, status = data[start:end], 206
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def log_message(self, *args: object) -> None:  # no line per request in the test output
                pass

        handlers: list[threading.Thread] = []
        self._handlers = handlers

        class Server(ThreadingHTTPServer):
            def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
                thread = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                                          name="audiobuffer-test-http-conn", daemon=True)
                handlers.append(thread)
                thread.start()

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="audiobuffer-test-http", daemon=True)
        self._thread.start()

    def url(self, name: str) -> str:
        return f"{self.endpoint}/{name}"

    def stop(self) -> None:
        """Stop serving and join every thread (bounded)."""
        self._server.shutdown()
        self._thread.join(JOIN_TIMEOUT)
        self._server.server_close()
        for thread in self._handlers:
            thread.join(JOIN_TIMEOUT)
        alive = [t.name for t in [self._thread, *self._handlers] if t.is_alive()]
        if alive:
            raise RuntimeError(f"HTTP server threads still alive after {JOIN_TIMEOUT} s: {alive}")

    def __enter__(self) -> HttpFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SilentServer:
    """A server on 127.0.0.1 that accepts connections and never answers: a hung store.

    The connections it accepted stay open, unread, until ``stop()`` closes them and joins its thread
    (``audiobuffer-test-silent``). ``connections`` counts them.
    """

    def __init__(self) -> None:
        self.connections = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._listener, self.port = _listen(0.05)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._accept_loop, name="audiobuffer-test-silent", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)
            self.connections += 1

    def stop(self) -> None:
        """Stop accepting, close every connection and join the thread (bounded)."""
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT)
        self._listener.close()
        for conn in self._held:
            conn.close()
        if self._thread.is_alive():
            raise RuntimeError(f"the silent server's thread is still alive after {JOIN_TIMEOUT} s")

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
