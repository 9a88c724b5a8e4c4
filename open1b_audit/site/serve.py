"""``open1b-audit serve``: the explorer's pages rendered on demand, on 127.0.0.1 only.

The same URLs as a static site (``static.py``), but any logged step, any document and any
search: a step page plans and reads only that step's windows (through the mix's seek index),
so a page costs the same at step 80,000 as at step 1; a large step's page plans only, and
each of its window pages reads and decodes only its ``data.PAGE_WINDOWS`` windows. One
lock serializes the library calls (plans and readers are not shared across threads); the
run, mix and coverage pages are rendered once. Nothing but loopback is bound, and only
requests whose ``Host`` names loopback (``127.0.0.1``, ``localhost``, ``[::1]``, any port)
are answered: a web page the auditor visits can point a name it controls at 127.0.0.1
(DNS rebinding) and read the answers as same-origin, but its requests carry its own name
(refused, 421). Certificates are served as the explorer parsed them (``static.cert_json``),
never read again from their files.
"""
from __future__ import annotations

import os
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from open1b_audit.site import render, static
from open1b_audit.site.data import Explorer
from open1b_audit.site.search import search

HOST = "127.0.0.1"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
HOST_HEADER = re.compile(r"^(127\.0\.0\.1|localhost|\[::1\])(:\d{1,5})?$", re.IGNORECASE)
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".json": "application/json"}
STEPS_RANGE = re.compile(r"^(\d+):(\d+)$")


class Site:
    """Page by URL path (and query), from one opened ``Explorer``."""

    def __init__(self, ex: Explorer) -> None:
        self.ex = ex
        self.lock = threading.Lock()
        self.cache: dict[str, bytes] = {}
        self.certs = static.published_certs(ex)

    def _cached(self, key: str, make) -> bytes:
        if key not in self.cache:
            self.cache[key] = make().encode("utf-8")
        return self.cache[key]

    def get(self, path: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        ex = self.ex
        has_step, has_doc = ex.has_step, (lambda k: True)
        name = path.lstrip("/") or "index.html"
        kind = TYPES.get(os.path.splitext(name)[1], "application/octet-stream")
        with self.lock:
            if name == "index.html":
                return 200, kind, self._cached(name, lambda: render.run_page(ex.run_page()))
            if name == "data/run.js":
                return 200, kind, self._cached(name, lambda: static.run_script(ex))
            if name == "mix.html":
                return 200, kind, self._cached(name, lambda: render.mix_page(ex.mix_page()))
            if name == "coverage.html":
                return 200, kind, self._cached(name, lambda: render.coverage_page(
                    ex.coverage_page(), has_step))
            if name in ("assets/explorer.js", "assets/explorer.css"):
                return 200, kind, static.asset(name.split("/")[1])
            if (m := re.fullmatch(r"data/curves-(\d+)\.js", name)):
                i = int(m.group(1))
                return 200, kind, render.data_script("OPEN1B_CHUNKS", ex.chunk(i), i).encode()
            if (m := re.fullmatch(r"step-(\d+)\.html", name)):
                d = ex.step_page(int(m.group(1)))
                return 200, kind, render.step_page(d, lambda s: 0 <= s <= ex.last,
                                                   has_doc).encode()
            if (m := re.fullmatch(r"step-(\d+)-windows-(\d+)\.html", name)):
                d = ex.window_page(int(m.group(1)), int(m.group(2)))
                return 200, kind, render.window_page(d, has_doc).encode()
            if (m := re.fullmatch(r"step-(\d+)-stats\.html", name)):
                return 200, kind, render.stats_page(ex.stats_page(int(m.group(1)))).encode()
            if (m := re.fullmatch(r"doc-(\d+-\d+-\d+)\.html", name)):
                return 200, kind, render.document_page(ex.document_page(m.group(1)),
                                                       has_step).encode()
            if name == "search.html":
                q = (query.get("q") or [""])[0]
                steps = None
                rng = (query.get("steps") or [""])[0]
                if (m := STEPS_RANGE.match(rng)):
                    steps = (int(m.group(1)), int(m.group(2)))
                res = search(ex, q, steps)
                return 200, kind, render.search_page(res, has_step, has_doc, q).encode()
            if name.startswith("certs/") and name[6:] in self.certs:
                return 200, kind, static.cert_json(self.certs[name[6:]])
        return 404, TYPES[".html"], render.error_page(f"no page {path}").encode()


def handler(site: Site) -> type[BaseHTTPRequestHandler]:
    from open1b.errors import Open1bError

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:              # noqa: N802 (http.server's name)
            u = urlsplit(self.path)
            host = self.headers.get("Host") or ""
            if not HOST_HEADER.match(host):
                code, kind, body = (HTTPStatus.MISDIRECTED_REQUEST, TYPES[".html"],
                                    render.error_page(
                                        f"this server answers only requests for "
                                        f"{', '.join(LOOPBACK_NAMES)}, not {host[:80]!r}"
                                    ).encode())
            else:
                try:
                    code, kind, body = site.get(u.path, parse_qs(u.query))
                except (Open1bError, ValueError, OSError) as e:
                    code, kind, body = (HTTPStatus.NOT_FOUND, TYPES[".html"],
                                        render.error_page(str(e)).encode())
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy",
                             "default-src 'self'; script-src 'self'; style-src 'self'")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

    return Handler


def make_server(ex: Explorer, port: int = 0) -> ThreadingHTTPServer:
    """A server bound to 127.0.0.1:port (0: any free port); call ``serve_forever``."""
    return ThreadingHTTPServer((HOST, port), handler(Site(ex)))
