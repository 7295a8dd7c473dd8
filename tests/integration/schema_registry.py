"""A schema registry for the tests: Confluent's REST API (the subset the avro codec uses), over real HTTP."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class SchemaRegistryServer:
    """``POST /subjects/{subject}/versions`` → ``{"id": N}``; ``GET /schemas/ids/{id}`` → ``{"schema": …}``."""

    def __init__(self) -> None:
        self.schemas: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                parts = self.path.strip("/").split("/")
                if len(parts) != 3 or parts[0] != "subjects" or parts[2] != "versions":
                    return self._reply(404, {"error_code": 404, "message": "not found"})
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                schema = json.dumps(json.loads(body["schema"]), sort_keys=True)
                ids = [i for i, s in registry.schemas.items() if s == schema]
                schema_id = ids[0] if ids else len(registry.schemas) + 1
                registry.schemas[schema_id] = schema
                versions = registry.subjects.setdefault(parts[1], [])
                if schema_id not in versions:
                    versions.append(schema_id)
                return self._reply(200, {"id": schema_id})

            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and int(parts[2]) in registry.schemas:
                    return self._reply(200, {"schema": registry.schemas[int(parts[2])]})
                return self._reply(404, {"error_code": 40403, "message": "Schema not found"})

            def _reply(self, status: int, doc: Any) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
