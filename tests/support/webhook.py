"""A local webhook receiver: what on-call's chat or pager would get (streamops.notifications)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from streamops.waiting import poll_until


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 keeping every JSON body POSTed to it, in order."""

    def __init__(self, status: int = 200):
        self.messages: list[dict] = []
        self.status = status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.messages.append({"path": self.path, **json.loads(body or b"{}")})
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, name="webhook-receiver", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/on-call"

    def connection_json(self) -> str:
        """The Airflow connection (AIRFLOW_CONN_STREAMOPS_NOTIFY) that points the suite at it."""
        return json.dumps({"conn_type": "http", "host": self.url})

    def wait_for(self, what: str, timeout: float = 120, **fields) -> dict:
        """The first message whose fields equal `fields`."""
        return poll_until(lambda: next((m for m in self.messages if all(m.get(k) == v for k, v in fields.items())), None),
                          timeout=timeout, what=f"the webhook to receive {what}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
