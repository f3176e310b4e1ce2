"""An App's metrics and health over HTTP: ``/metrics`` and ``/healthz`` on one port.

``/metrics`` is prometheus_client's own WSGI app over the App's registry (text or
OpenMetrics by the Accept header, gzip when asked, ``name[]`` filters); ``/healthz``
answers 200 or 503 with a small JSON body from a callable the App gives. wsgiref
serves both: prometheus_client's ``ThreadingWSGIServer`` (a daemon thread per request,
so a slow scrape does not hold up a health probe) with its accept loop on a thread of
its own.

The socket is bound when the server is made, so that a port in use is a
:class:`~redrive.errors.ConfigError` at start-up rather than a traceback later, and
:meth:`MetricsServer.close` shuts the accept loop, closes the socket and joins the
thread: nothing is left listening once it returns.
"""

from __future__ import annotations

import errno
import json
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

import structlog
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from redrive.errors import ConfigError
from redrive.ports import listener_of

log = structlog.get_logger("redrive.consumer")

PORT_SETTING = "App(metrics_port=...)"
HOST_SETTING = "App(metrics_host=...)"
# How long the accept loop waits between looks at a shutdown request: the most
# close() waits for it.
_POLL_INTERVAL_S = 0.1


@dataclass(frozen=True)
class Health:
    """What ``/healthz`` answers: 200 when ``ok``, else 503; ``detail`` joins the body
    (a ``status`` there, such as ``degraded``, replaces ``ok``)."""

    ok: bool
    detail: Mapping[str, object]


def check_port(port: int | None) -> int | None:
    """``metrics_port`` as given, or a ConfigError if it cannot be a TCP port."""
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(
            PORT_SETTING,
            f"{port!r} is not a TCP port",
            "give a port number from 1 to 65535, 0 for any free port, or None for no server",
        )
    return port


def check_host(host: str) -> str:
    """``metrics_host`` as given, or a ConfigError if it is not even a name."""
    if not isinstance(host, str) or not host.strip():
        raise ConfigError(
            HOST_SETTING,
            f"{host!r} is not a host name or address",
            "use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)",
        )
    return host


class _QuietHandler(WSGIRequestHandler):
    # A client that connects and sends nothing holds its request thread this long at
    # most (seconds per read), not forever.
    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: a line on stderr per scrape would drown the App's own logs."""


class MetricsServer:
    """``/metrics`` and ``/healthz`` on ``host:port``, served until :meth:`close`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        health: Callable[[], Health],
        host: str,
        port: int,
    ) -> None:
        family, address = _resolve(host, port)

        class Server(ThreadingWSGIServer):
            address_family = family

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A scraper that hangs up mid-answer is not worth a traceback on stderr.
                log.debug("metrics request failed", client=str(client_address), exc_info=True)

        try:
            self._server = Server((address, port), _QuietHandler)
        except OSError as exc:
            raise _bind_error(exc, host, port) from exc
        self._server.set_app(_routes(make_wsgi_app(registry), health))
        self.host, self.port = str(self._server.server_address[0]), self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(_POLL_INTERVAL_S,),
            name=f"redrive-metrics-{self.port}",
            daemon=True,
        )
        self._thread.start()
        self._closed = False
        log.info("metrics served", url=self.url("/metrics"))

    def url(self, path: str = "") -> str:
        """``http://host:port`` + path, with a host a local client can connect to."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)  # noqa: S104
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        """Stop serving: the accept loop ends, the socket closes, the thread is joined."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _resolve(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address to bind, and whether it is IPv4 or IPv6 (wsgiref assumes IPv4)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(
            HOST_SETTING,
            f"{host!r} is not an address of this machine ({exc.strerror})",
            "use 127.0.0.1 (this machine only), 0.0.0.0 or :: (every interface)",
        ) from exc
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])


def _bind_error(exc: OSError, host: str, port: int) -> ConfigError:
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(
            f"App(metrics_port={port})",
            f"{host}:{port} is already in use by {listener_of(port)}",
            "choose another port, stop what holds it, or use metrics_port=0 for any free "
            "port (app.metrics_url then says which)",
        )
    if exc.errno == errno.EACCES:
        return ConfigError(
            f"App(metrics_port={port})",
            f"not allowed to listen on {host}:{port} (ports below 1024 need privileges)",
            "use a port from 1024 up, e.g. 9464 (Prometheus's usual exporter port)",
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(
            HOST_SETTING,
            f"{host!r} is not an address of this machine",
            "use 127.0.0.1 (this machine only), 0.0.0.0 or :: (every interface)",
        )
    return ConfigError(f"App(metrics_port={port})", f"cannot listen on {host}:{port}: {exc}")


def _routes(metrics: WSGIApplication, health: Callable[[], Health]) -> WSGIApplication:
    """``/metrics`` to prometheus_client, ``/healthz`` to the health check, else 404."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path != "/healthz":
            return _answer(start_response, "404 Not Found", b"try /metrics or /healthz\n")
        if environ.get("REQUEST_METHOD") != "GET":
            return _answer(start_response, "405 Method Not Allowed", b"use GET\n", allow="GET")
        try:
            state = health()
        except Exception as exc:  # a broken check is an unhealthy answer, not a 500
            log.exception("health check failed")
            state = Health(False, {"reason": f"health check failed: {exc!r}"})
        body = {"status": "ok" if state.ok else "unavailable", **state.detail}
        return _answer(
            start_response,
            "200 OK" if state.ok else "503 Service Unavailable",
            json.dumps(body).encode(),
            content_type="application/json",
        )

    return app


def _answer(
    start_response: StartResponse,
    status: str,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    allow: str | None = None,
) -> list[bytes]:
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
    ]
    if allow is not None:
        headers.append(("Allow", allow))
    start_response(status, headers)
    return [body]
