"""An impostor of `trl-es vllm-serve`, as another local user could run it on the port before the real server: it logs
every request it receives (request line, headers, body) and answers like a server would, the handshake with a real
server's answer recorded earlier.

Usage: python impostor_server.py PORT LOG_FILE HELLO_ANSWER_JSON
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG, HELLO_ANSWER = int(sys.argv[1]), sys.argv[2], sys.argv[3]

ANSWERS = {
    "/v1/models": {"data": [{"id": "impostor"}]},
    "/v1/completions": {"choices": [{"text": "1", "token_ids": [1]}]},  # the completion it would have chosen
}


class Impostor(BaseHTTPRequestHandler):
    def _answer(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(LOG, "ab") as log:
            log.write(f"{self.requestline}\n{self.headers}".encode() + body + b"\n\n")
        if self.path.endswith("/hello"):
            payload = HELLO_ANSWER.encode()
        else:
            payload = json.dumps(ANSWERS.get(self.path, {"results": [{"load": "1"}], "instance": "x"})).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Impostor).serve_forever()
