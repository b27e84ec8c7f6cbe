"""Record every request as one JSON line on stdout; see the package docstring."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "SINK "  # lines the test parses start with this; anything else is noise
_out = threading.Lock()


def emit(record: dict[str, Any]) -> None:
    line = PREFIX + json.dumps(record, sort_keys=True, separators=(",", ":"))
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _handle(self) -> None:
        now = time.time()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path == "/health":
            self._reply(200, b"ok")
            return
        emit({"t": round(now, 6), "method": self.command, "path": self.path,
              "peer": self.client_address[0], "headers": dict(self.headers.items()),
              "body": body.decode("utf-8", "replace")[:2000]})
        self._reply(200, b"ok")

    def _reply(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except OSError:
            pass

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

    def log_message(self, *args: Any) -> None:
        pass


def main() -> None:
    port = int(os.environ.get("SINK_PORT", "8080"))
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.daemon_threads = True
    # SIGTERM (docker stop): stop serving and exit 0 at once.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    emit({"listening": port})
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
