"""A reverse proxy on 127.0.0.1 in front of an S3 server (:mod:`benchmarks.s3_server`): a real HTTP/1.1 hop that
can add latency to every request (issue 47's "a proxy on 127.0.0.1 that adds 30 ms to every request") and can play a
store that does not honour conditional writes (an old S3-compatible store) by removing ``If-None-Match`` and
``If-Match`` from the requests it forwards::

    with s3_server(log_dir) as query, s3_proxy(query, delay_s=0.03) as slow:
        store = CloudStore(f"s3://runs/lab?{slow}")
        ...
        slow.counts["PUT"]  # requests the proxy forwarded, by HTTP method

Every method is forwarded with its request line (path and query string), headers (``Host`` as the client sent it,
so a SigV4 signature still holds) and body unchanged (a ``Transfer-Encoding: chunked`` body is relayed with its
framing as it came); status, headers and body come back streamed, less the hop-by-hop ``Connection`` and
``Keep-Alive`` headers (the proxy keeps its own connection to the client alive). One upstream connection a request.
Standard library only.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlencode

__all__ = ["CONDITION_HEADERS", "ProxyQuery", "s3_proxy"]

#: The request headers ``drop_conditions`` removes: what makes S3's PUT create-only or matched on an ETag.
CONDITION_HEADERS = ("If-None-Match", "If-Match")
#: Response headers that are the hop's own, not the server's: not passed back.
_HOP_BY_HOP = ("connection", "keep-alive")
#: How long one upstream request, or an idle client connection, may take.
_TIMEOUT_S = 60.0
_CHUNK = 1 << 16


class ProxyQuery(str):
    """The URI query that reaches the proxy (a ``str``), with what the proxy saw so far:

    - ``counts``: HTTP method → requests received (counted as each arrives, before ``delay_s``);
    - ``chunked``: HTTP method → requests whose body came with ``Transfer-Encoding: chunked``;
    - ``dropped``: HTTP method → requests that lost a condition header to ``drop_conditions``.
    """

    counts: collections.Counter[str]
    chunked: collections.Counter[str]
    dropped: collections.Counter[str]
    port: int

    def __new__(cls, query: str, port: int) -> ProxyQuery:
        self = super().__new__(cls, query)
        self.port = port
        self.counts, self.chunked, self.dropped = collections.Counter(), collections.Counter(), collections.Counter()
        return self


def _upstream(query: str) -> tuple[str, int, dict[str, str]]:
    """The S3 server's host and port in ``query`` (``endpoint_override=127.0.0.1:PORT&scheme=http&…``) and the
    query's options; ValueError when it names no plain-HTTP endpoint on this machine."""
    options = dict(parse_qsl(query, keep_blank_values=True))
    endpoint = options.get("endpoint_override", "")
    if "://" in endpoint:
        scheme, _, endpoint = endpoint.partition("://")
        if scheme != "http":
            raise ValueError(f"{query!r}: the proxy forwards plain HTTP only")
    host, _, port = endpoint.rpartition(":")
    if options.get("scheme", "http") != "http" or host not in ("127.0.0.1", "localhost") or not port.isdigit():
        raise ValueError(f"{query!r}: not an S3 server on 127.0.0.1 over http (endpoint_override=127.0.0.1:PORT)")
    return host, int(port), options


def _handler(host: str, port: int, seen: ProxyQuery, delay_s: float, drop_conditions: bool, conns: set, lock):
    dropped = {h.lower() for h in CONDITION_HEADERS}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive to the client, as an S3 endpoint does
        timeout = _TIMEOUT_S

        def setup(self) -> None:
            super().setup()
            with lock:
                conns.add(self.connection)

        def finish(self) -> None:
            with lock:
                conns.discard(self.connection)
            super().finish()

        def log_message(self, format, *args) -> None:  # quiet: the server's log has every request
            pass

        def _forward(self) -> None:
            method = self.command
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            headers = list(self.headers.items())
            kept = [(k, v) for k, v in headers if not (drop_conditions and k.lower() in dropped)]
            with lock:
                seen.counts[method] += 1
                if chunked:
                    seen.chunked[method] += 1
                if len(kept) < len(headers):
                    seen.dropped[method] += 1
            if delay_s > 0:
                time.sleep(delay_s)
            upstream = http.client.HTTPConnection(host, port, timeout=_TIMEOUT_S)
            try:
                try:
                    upstream.putrequest(method, self.path, skip_host=True, skip_accept_encoding=True)
                    for name, value in kept:
                        upstream.putheader(name, value)
                    upstream.endheaders()
                    self._relay_body(upstream, chunked)
                    response = upstream.getresponse()
                except OSError as exc:
                    self.close_connection = True
                    self.send_error(502, f"upstream {host}:{port}: {exc}")
                    return
                self._relay_response(response)
            finally:
                upstream.close()

        def _relay_body(self, upstream: http.client.HTTPConnection, chunked: bool) -> None:
            """The request's body to ``upstream`` as it came: ``Content-Length`` bytes, or the chunked framing."""
            if chunked:
                while True:
                    line = self.rfile.readline(1024)
                    upstream.send(line)
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:  # the trailer, up to its empty line
                        while line not in (b"\r\n", b"\n", b""):
                            line = self.rfile.readline(8192)
                            upstream.send(line)
                        return
                    left = size + 2  # the chunk and its CRLF
                    while left:
                        piece = self.rfile.read(min(left, _CHUNK))
                        if not piece:
                            raise ConnectionError("the client closed the connection in a chunk")
                        upstream.send(piece)
                        left -= len(piece)
            left = int(self.headers.get("Content-Length") or 0)
            while left:
                piece = self.rfile.read(min(left, _CHUNK))
                if not piece:
                    raise ConnectionError("the client closed the connection in the body")
                upstream.send(piece)
                left -= len(piece)

        def _relay_response(self, response: http.client.HTTPResponse) -> None:
            self.send_response_only(response.status, response.reason)
            headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            for name, value in headers:
                self.send_header(name, value)
            framed = response.chunked or any(k.lower() == "content-length" for k, _ in headers)
            bodiless = self.command == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200
            if not (framed or bodiless):  # a body that ends when the connection does
                self.close_connection = True
                self.send_header("Connection", "close")
            self.end_headers()
            if bodiless:
                return
            while piece := response.read1(_CHUNK):
                if response.chunked:  # http.client took the chunks apart: frame them again
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                else:
                    self.wfile.write(piece)
            if response.chunked:
                self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _forward

    return Handler


@contextlib.contextmanager
def s3_proxy(query: str, *, delay_s: float = 0.0, drop_conditions: bool = False) -> Iterator[ProxyQuery]:
    """Start a proxy on a free port of 127.0.0.1 in front of the S3 server that ``query`` reaches (its URI query:
    ``endpoint_override=127.0.0.1:PORT&scheme=http&region=us-east-1``) and yield the query that reaches the proxy
    instead (a :class:`ProxyQuery`: the same options, the proxy's endpoint; its ``counts`` say how many requests of
    each method arrived). Each request waits ``delay_s`` before it is forwarded; ``drop_conditions`` removes its
    ``If-None-Match`` and ``If-Match`` headers. On exit the proxy stops listening and closes the connections it
    holds, within seconds. ValueError when ``query`` names no plain-HTTP server on 127.0.0.1."""
    host, port, options = _upstream(query)
    conns: set[socket.socket] = set()
    lock = threading.Lock()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), None)  # type: ignore[arg-type]
    server.daemon_threads = True
    proxy_port = server.server_address[1]
    seen = ProxyQuery(urlencode({**options, "endpoint_override": f"127.0.0.1:{proxy_port}"}, safe=":"), proxy_port)
    server.RequestHandlerClass = _handler(host, port, seen, delay_s, drop_conditions, conns, lock)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                              name=f"s3-proxy-{proxy_port}")  # fmt: skip
    thread.start()
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()
        with lock:
            for conn in list(conns):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        thread.join(timeout=5)
