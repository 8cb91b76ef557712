#!/usr/bin/env python3
"""An HTTP/1.1-aware TCP proxy for tests and benchmarks, placed in front of an S3-compatible
server (moto's standalone server): it delays every request, injects S3 ``503 Slow Down`` errors
into GETs, caps the server-to-client bandwidth, and counts what went through exactly.

Standard library only; one thread per client connection and one upstream connection per client
connection (opened when the first request is forwarded, reopened when upstream closes it).

In a test (a background thread of the test process)::

    from s3proxy import Proxy, start_moto

    moto, moto_port = start_moto()
    with Proxy(moto_port, delay_ms=50) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.endpoint, ...)
        ...
        proxy.counts()   # {"requests": 3, "gets": 2, "ranged_gets": 1, ...}

As a process (benchmarks)::

    python s3proxy.py --upstream http://127.0.0.1:PORT --delay-ms 50 [--port 0] [--error-rate 0.01]
                      [--seed 0] [--bandwidth BYTES_PER_S] [--bandwidth-scope connection|total]

prints ``listening http://127.0.0.1:PORT`` on stdout once it accepts connections, and runs until
SIGTERM or SIGINT. It is steered over HTTP on its own port (``RemoteProxy`` wraps this); these
requests are neither counted, delayed nor logged (no bucket name can start with ``__``):

    GET /__proxy__/counts               the counts as JSON
    GET /__proxy__/log                  the log as JSON (a list of 5-element lists)
    GET /__proxy__/reset                reset_counts() (also clears the log)
    GET /__proxy__/set?delay_ms=50&error_rate=0.1&bandwidth=1e6   (bandwidth=none: unlimited)

What is counted (``counts()``):

- ``requests``: every request read from a client (forwarded or answered by the proxy);
- ``gets``: GET requests (listings included), ``ranged_gets``: those with a ``Range`` header,
  ``heads``: HEAD requests, ``puts``: PUT requests, ``lists``: GETs of a listing (a
  ``list-type`` query parameter, or a query and no object key: ``/bucket?...``);
- ``errors_injected``: GETs answered with the proxy's own 503;
- ``bytes_down``: every byte sent to clients (response heads and bodies, injected errors and
  ``100 Continue`` interim responses included); ``bytes_up``: every byte read from clients;
- ``body_bytes``: response-body bytes of the GETs forwarded upstream (the decoded payload of a
  chunked body; the injected errors' bodies are not included).

``log()``: one tuple per request, when its response is complete (or the connection broke):
``(method, path_with_query, range_header_or_None, status, body_bytes)``; status is 502 when
upstream could not be reached, and the status seen so far (or None) when a connection broke.

Requests with ``Expect: 100-continue`` (boto3's uploads) are answered ``100 Continue`` by the
proxy itself and forwarded without that header, once their body has been read: the delay
applies to whole requests. Request bodies (Content-Length or chunked) are buffered in memory.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any
from urllib.parse import parse_qsl, urlsplit

SLOW_DOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n'
                  b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
                  b"<RequestId>s3proxy</RequestId></Error>")
CONTROL_PREFIX = "/__proxy__/"
#: Bytes relayed per send; with a bandwidth cap, at most 1/50 s worth of bytes.
PIECE = 64 * 1024
#: Longest request or response head accepted.
MAX_HEAD = 256 * 1024
_UNSET: Any = object()

COUNT_KEYS = ("requests", "gets", "ranged_gets", "heads", "puts", "lists", "errors_injected", "bytes_down",
              "bytes_up", "body_bytes")


class _Closed(Exception):
    """The peer closed the connection (or it broke, or the proxy is stopping)."""


class _BadMessage(Exception):
    """A malformed HTTP message."""


class _UpstreamGone(Exception):
    """Upstream closed its connection before the response began (or the request could not be sent)."""


class _Reader:
    """Buffered reads from a socket."""

    def __init__(self, sock: socket.socket, on_bytes=None):
        self.sock = sock
        self.buf = bytearray()
        self.on_bytes = on_bytes

    def _fill(self) -> None:
        try:
            data = self.sock.recv(PIECE)
        except OSError as e:
            raise _Closed(str(e)) from e
        if not data:
            raise _Closed("EOF")
        if self.on_bytes is not None:
            self.on_bytes(len(data))
        self.buf += data

    def until(self, sep: bytes, limit: int = MAX_HEAD) -> bytes:
        start = 0
        while True:
            i = self.buf.find(sep, start)
            if i >= 0:
                out = bytes(self.buf[: i + len(sep)])
                del self.buf[: i + len(sep)]
                return out
            if len(self.buf) > limit:
                raise _BadMessage("head too long")
            start = max(0, len(self.buf) - len(sep) + 1)
            self._fill()

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def some(self, n: int) -> bytes:
        """Between 1 and `n` bytes (raises _Closed at EOF)."""
        if not self.buf:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def _parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    """The start line and the headers (name, value) of an HTTP message head."""
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadMessage(f"bad header line {line!r}")
        headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    name = name.lower()
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def _is_chunked(headers: list[tuple[str, str]]) -> bool:
    te = _header(headers, "transfer-encoding")
    return te is not None and "chunked" in te.lower()


def _wants_close(version: str, headers: list[tuple[str, str]]) -> bool:
    conn = (_header(headers, "connection") or "").lower()
    if "close" in conn:
        return True
    return version.upper() == "HTTP/1.0" and "keep-alive" not in conn


def _is_list(path_with_query: str) -> bool:
    parts = urlsplit(path_with_query)
    query = parts.query
    if not query:
        return False
    if any(k == "list-type" for k, _ in parse_qsl(query, keep_blank_values=True)):
        return True
    _bucket, _, key = parts.path.lstrip("/").partition("/")
    return key == ""


def _read_chunked(reader: _Reader, sink, before_last=None) -> int:
    """Reads a chunked body from `reader`, passing its raw bytes to `sink` as they come; returns
    the payload size. `before_last(payload)` is called before the last bytes go to `sink`."""
    payload = 0
    while True:
        line = reader.until(b"\r\n", 4096)
        sink(line)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError as e:
            raise _BadMessage(f"bad chunk size line {line!r}") from e
        if size == 0:
            while True:  # trailers, up to the empty line
                t = reader.until(b"\r\n", MAX_HEAD)
                if t == b"\r\n":
                    if before_last is not None:
                        before_last(payload)
                    sink(t)
                    return payload
                sink(t)
        left = size + 2  # the data and its CRLF
        while left:
            piece = reader.some(min(left, PIECE))
            sink(piece)
            left -= len(piece)
        payload += size


class _Pace:
    """The virtual clock of a bandwidth cap (one per connection, or one shared by all)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_t = 0.0


class Proxy:
    """An HTTP proxy on 127.0.0.1 in front of ``127.0.0.1:upstream_port``.

    ``bandwidth`` (bytes/s, server to client; None = unlimited) caps each client connection
    (``bandwidth_scope="connection"``, like S3's per-connection throughput) or all connections
    together (``"total"``, like one network link).
    """

    def __init__(self, upstream_port: int, delay_ms: float = 0.0, error_rate: float = 0.0, seed: int = 0,
                 bandwidth: float | None = None, *, upstream_host: str = "127.0.0.1", port: int = 0,
                 bandwidth_scope: str = "connection"):
        if bandwidth_scope not in ("connection", "total"):
            raise ValueError("bandwidth_scope is 'connection' or 'total'")
        self.upstream = (upstream_host, upstream_port)
        self.delay_ms = float(delay_ms)
        self.error_rate = float(error_rate)
        self.bandwidth = float(bandwidth) if bandwidth else None
        self.bandwidth_scope = bandwidth_scope
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNT_KEYS, 0)
        self._log: list[tuple[str, str, str | None, int | None, int]] = []
        self._stop = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._total_pace = _Pace()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(256)
        self.port: int = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._acceptor: threading.Thread | None = None

    # -- public API -------------------------------------------------------------------------

    def start(self) -> Proxy:
        if self._acceptor is None:
            self._acceptor = threading.Thread(target=self._accept_loop, name=f"s3proxy-{self.port}", daemon=True)
            self._acceptor.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for s in [self._listener, *self._tracked()]:
            _shut(s)
        if self._acceptor is not None:
            self._acceptor.join(1.0)
        with self._lock:
            threads = list(self._threads)
        deadline = time.monotonic() + 1.0
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def set(self, delay_ms: float | None = None, error_rate: float | None = None, bandwidth: Any = _UNSET) -> None:
        """Changes settings at run time (None: unchanged; for `bandwidth`, None is unlimited)."""
        if delay_ms is not None:
            self.delay_ms = float(delay_ms)
        if error_rate is not None:
            self.error_rate = float(error_rate)
        if bandwidth is not _UNSET:
            self.bandwidth = float(bandwidth) if bandwidth else None

    def reset_counts(self) -> None:
        """Zeroes the counts and clears the log."""
        with self._lock:
            self._counts = dict.fromkeys(COUNT_KEYS, 0)
            self._log = []

    def counts(self) -> dict:
        with self._lock:
            return dict(self._counts)

    def log(self) -> list:
        with self._lock:
            return list(self._log)

    # -- internals ----------------------------------------------------------------------------

    def _add(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self._counts[k] += v

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.add(s)
        if self._stop.is_set():
            _shut(s)

    def _untrack(self, s: socket.socket | None) -> None:
        if s is None:
            return
        with self._lock:
            self._sockets.discard(s)
        try:
            s.close()
        except OSError:
            pass

    def _tracked(self) -> list[socket.socket]:
        with self._lock:
            return list(self._sockets)

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._track(client)
            t = threading.Thread(target=self._serve, args=(client,), name=f"s3proxy-conn-{self.port}", daemon=True)
            with self._lock:
                self._threads.add(t)
            t.start()
        try:
            self._listener.close()
        except OSError:
            pass

    def _send(self, sock: socket.socket, data: bytes, pace: _Pace | None) -> None:
        """Sends `data` to a client, counted in bytes_down, paced by the bandwidth cap."""
        view = memoryview(data)
        while len(view):
            bw = self.bandwidth
            n = len(view) if not bw else max(1, min(len(view), PIECE, int(bw / 50)))
            if bw and pace is not None:
                shared = self._total_pace if self.bandwidth_scope == "total" else pace
                with shared.lock:
                    now = time.monotonic()
                    shared.next_t = max(now, shared.next_t) + n / bw
                    wait = shared.next_t - now
                if wait > 0 and self._stop.wait(wait):
                    raise _Closed("stopping")
            self._add(bytes_down=n)  # before the bytes leave: a client never sees uncounted bytes
            try:
                sock.sendall(view[:n])
            except OSError as e:
                self._add(bytes_down=-n)
                raise _Closed(str(e)) from e
            view = view[n:]

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        up_reader: _Reader | None = None
        reader = _Reader(client, on_bytes=lambda n: self._add(bytes_up=n))
        pace = _Pace()
        try:
            while not self._stop.is_set():
                # The request: head, then body.
                try:
                    head = reader.until(b"\r\n\r\n")
                except _Closed:
                    return
                start, headers = _parse_head(head)
                parts = start.split(" ")
                if len(parts) != 3:
                    raise _BadMessage(f"bad request line {start!r}")
                method, target, version = parts[0].upper(), parts[1], parts[2]
                if target.startswith(CONTROL_PREFIX):
                    self._control(client, target, pace)
                    continue
                expect = (_header(headers, "expect") or "").lower() == "100-continue"
                if expect:
                    headers = [(k, v) for k, v in headers if k.lower() != "expect"]
                    head = (start + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1")
                    self._send(client, b"HTTP/1.1 100 Continue\r\n\r\n", None)
                body = bytearray()
                if _is_chunked(headers):
                    _read_chunked(reader, body.extend)
                else:
                    length = int(_header(headers, "content-length") or 0)
                    if length:
                        body += reader.exactly(length)
                client_close = _wants_close(version, headers)
                rng_header = _header(headers, "range")
                is_get = method == "GET"
                self._add(requests=1, gets=int(is_get), ranged_gets=int(is_get and rng_header is not None),
                          heads=int(method == "HEAD"), puts=int(method == "PUT"),
                          lists=int(is_get and _is_list(target)))
                # The delay, then an injected error or the upstream round trip.
                delay, rate = self.delay_ms, self.error_rate
                if delay > 0 and self._stop.wait(delay / 1000.0):
                    return
                if is_get and rate > 0:
                    with self._lock:
                        inject = self._rng.random() < rate
                    if inject:
                        resp = (f"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                                f"Content-Length: {len(SLOW_DOWN_BODY)}\r\nx-amz-request-id: s3proxy\r\n"
                                f"{'Connection: close' if client_close else 'Connection: keep-alive'}\r\n\r\n"
                                ).encode("latin-1") + SLOW_DOWN_BODY
                        self._add(errors_injected=1)
                        self._record(method, target, rng_header, 503, len(SLOW_DOWN_BODY))
                        self._send(client, resp, pace)
                        if client_close:
                            return
                        continue
                for attempt in (0, 1):
                    if upstream is None:
                        try:
                            upstream = socket.create_connection(self.upstream, timeout=10)
                        except OSError:
                            msg = b"upstream unreachable"
                            self._record(method, target, rng_header, 502, len(msg))
                            self._send(client, b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: %d\r\n"
                                       b"Connection: close\r\n\r\n%s" % (len(msg), msg), None)
                            return
                        upstream.settimeout(None)
                        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        self._track(upstream)
                        up_reader = _Reader(upstream)
                    assert up_reader is not None
                    try:
                        try:
                            upstream.sendall(head + bytes(body))
                        except OSError:
                            raise _UpstreamGone() from None
                        keep = self._relay(method, target, rng_header, up_reader, client, pace)
                        break
                    except _UpstreamGone:
                        # A kept-alive upstream connection that upstream had closed: once more on
                        # a fresh one (nothing reached the client yet).
                        self._untrack(upstream)
                        upstream, up_reader = None, None
                        if attempt or self._stop.is_set():
                            self._record(method, target, rng_header, None, 0)
                            return
                if not keep or client_close:
                    return
        except (_Closed, _BadMessage):
            return
        finally:
            self._untrack(upstream)
            self._untrack(client)
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _relay(self, method: str, target: str, rng_header: str | None, up: _Reader, client: socket.socket,
               pace: _Pace) -> bool:
        """Relays one response from upstream to the client. Returns True to keep both connections,
        False to close both; raises _UpstreamGone when upstream closed before the response began.
        The response is counted and logged before its last bytes go to the client, so that a
        client that has its response never sees counts without it."""
        status: int | None = None
        body_bytes = 0
        finished = False

        def finish() -> None:
            nonlocal finished
            if not finished:
                finished = True
                self._finish(method, target, rng_header, status, body_bytes)

        try:
            while True:
                try:
                    head = up.until(b"\r\n\r\n")
                except _Closed:
                    if status is None and not up.buf:
                        raise _UpstreamGone() from None
                    raise
                start, headers = _parse_head(head)
                version, _, rest = start.partition(" ")
                status = int(rest.split(" ", 1)[0])
                if 100 <= status < 200 and status != 101:
                    self._send(client, head, pace)
                    continue
                break
            upstream_closes = _wants_close(version, headers)
            length = _header(headers, "content-length")
            if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                finish()
                self._send(client, head, pace)
            elif _is_chunked(headers):
                self._send(client, head, pace)

                def last(payload: int) -> None:
                    nonlocal body_bytes
                    body_bytes = payload
                    finish()

                _read_chunked(up, lambda b: self._send(client, b, pace), last)
            elif length is not None:
                left = int(length)
                if not left:
                    finish()
                self._send(client, head, pace)
                while left:
                    piece = up.some(min(left, PIECE))
                    left -= len(piece)
                    body_bytes += len(piece)
                    if not left:
                        finish()
                    self._send(client, piece, pace)
            else:  # the body runs to the end of the connection
                self._send(client, head, pace)
                try:
                    while True:
                        piece = up.some(PIECE)
                        body_bytes += len(piece)
                        self._send(client, piece, pace)
                except _Closed:
                    pass
                finish()
                return False  # the client sees the end of the body when the connection closes
            # Upstream's "Connection: close" went to the client too: it closes its side.
            return not upstream_closes
        except (_Closed, _BadMessage, ValueError):
            finish()
            return False

    def _finish(self, method: str, target: str, rng_header: str | None, status: int | None, body_bytes: int) -> None:
        with self._lock:
            if method == "GET":
                self._counts["body_bytes"] += body_bytes
            self._log.append((method, target, rng_header, status, body_bytes))

    def _record(self, method: str, target: str, rng_header: str | None, status: int | None, body_bytes: int) -> None:
        with self._lock:
            self._log.append((method, target, rng_header, status, body_bytes))

    def _control(self, client: socket.socket, target: str, pace: _Pace) -> None:
        parts = urlsplit(target)
        what = parts.path[len(CONTROL_PREFIX):].strip("/")
        status, out = "200 OK", None
        if what == "counts":
            out = self.counts()
        elif what == "log":
            out = self.log()
        elif what == "reset":
            self.reset_counts()
            out = {"ok": True}
        elif what == "set":
            q = dict(parse_qsl(parts.query))
            kw: dict[str, Any] = {}
            if "delay_ms" in q:
                kw["delay_ms"] = float(q["delay_ms"])
            if "error_rate" in q:
                kw["error_rate"] = float(q["error_rate"])
            if "bandwidth" in q:
                kw["bandwidth"] = None if q["bandwidth"].lower() in ("", "none", "0") else float(q["bandwidth"])
            self.set(**kw)
            out = {"delay_ms": self.delay_ms, "error_rate": self.error_rate, "bandwidth": self.bandwidth}
        else:
            status, out = "404 Not Found", {"error": f"unknown control path {what!r}"}
        data = json.dumps(out).encode()
        try:
            client.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                           f"\r\n".encode() + data)
        except OSError as e:
            raise _Closed(str(e)) from e


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


class RemoteProxy:
    """The counts and settings of a proxy that runs in another process (``python s3proxy.py``),
    through its control paths."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint.rstrip("/")

    def _get(self, what: str) -> Any:
        with urllib.request.urlopen(f"{self.endpoint}{CONTROL_PREFIX}{what}", timeout=30) as r:
            return json.loads(r.read())

    def counts(self) -> dict:
        return self._get("counts")

    def log(self) -> list:
        return [tuple(e) for e in self._get("log")]

    def reset_counts(self) -> None:
        self._get("reset")

    def set(self, delay_ms: float | None = None, error_rate: float | None = None, bandwidth: Any = _UNSET) -> dict:
        q = []
        if delay_ms is not None:
            q.append(f"delay_ms={delay_ms}")
        if error_rate is not None:
            q.append(f"error_rate={error_rate}")
        if bandwidth is not _UNSET:
            q.append(f"bandwidth={bandwidth or 'none'}")
        return self._get("set?" + "&".join(q))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    """Waits until 127.0.0.1:`port` accepts connections (raises RuntimeError after `timeout`
    seconds, or when `proc` exits)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port}") from None
            time.sleep(0.05)


def start_moto(python: str = sys.executable, port: int | None = None) -> tuple[subprocess.Popen, int]:
    """Starts moto's standalone S3 server on 127.0.0.1; returns (process, port). The caller
    terminates the process."""
    port = port or free_port()
    proc = subprocess.Popen([python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc)
    except RuntimeError:
        proc.kill()
        proc.wait()
        raise RuntimeError("moto's S3 server did not start") from None
    return proc, port


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="http://HOST:PORT of the S3 server")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--error-rate", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s server->client (default: unlimited)")
    ap.add_argument("--bandwidth-scope", choices=("connection", "total"), default="connection")
    args = ap.parse_args(argv)
    up = urlsplit(args.upstream if "//" in args.upstream else f"http://{args.upstream}")
    if up.port is None:
        ap.error("--upstream needs a port")
    proxy = Proxy(up.port, args.delay_ms, args.error_rate, args.seed, args.bandwidth,
                  upstream_host=up.hostname or "127.0.0.1", port=args.port, bandwidth_scope=args.bandwidth_scope)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    proxy.start()
    print(f"listening {proxy.endpoint}", flush=True)
    while not done.wait(0.5):
        pass
    proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
