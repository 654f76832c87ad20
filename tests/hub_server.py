"""A Hugging Face Hub on 127.0.0.1 for push tests: the HTTP endpoints `huggingface_hub` uploads through.

Point a client at it with `HF_ENDPOINT=hub.url`, `HF_TOKEN=hub.token` and `HF_HUB_DISABLE_XET=1`. It serves what an
upload needs, the way the Hub answers it where the client depends on the answer:

- `POST /api/repos/create`: a repo named without a namespace lands in the token's user's (`hub.user`); a new repo
  has one commit on `main` with the Hub's default `.gitattributes`; an existing one answers 409, as the Hub does.
- `POST /api/validate-yaml`: the README's YAML front matter must parse (400 with the error otherwise).
- `POST /api/models/{repo}/preupload/{revision}`: LFS for the default `.gitattributes` patterns, binary samples and
  files over 10 MB, regular otherwise; the oid of the file already on the branch, so unchanged files are skipped.
- `POST /{repo}.git/info/lfs/objects/batch`, the basic `PUT` and `verify`: the content's sha256 must be its oid.
- `POST /api/models/{repo}/commit/{revision}`: the NDJSON commit; an `lfsFile` must have been uploaded.
- `POST /api/models/{repo}/branch/{branch}`, `GET /api/models/{repo}[/revision/{revision}]`.

Writes need `Authorization: Bearer <hub.token>` (401 otherwise), and a revision that is not a branch is a 404
`RevisionNotFound`, as on the Hub. Not served: the Xet transfer protocol (hence `HF_HUB_DISABLE_XET=1`: the same
files then travel through LFS) and pull requests. Every other request is answered 404 and kept in `hub.unexpected`.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import yaml

# The patterns of the `.gitattributes` the Hub writes into a new model repo: files stored with LFS.
LFS_PATTERNS = (
    "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack *.npy *.npz "
    "*.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar *.safetensors saved_model/**/* *.tar.* *.tar "
    "*.tflite *.tgz *.wasm *.xz *.zip *.zst *tfevents*"
).split()
GITATTRIBUTES = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in LFS_PATTERNS).encode()
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024

REPO = r"(?P<repo>[^/]+/[^/]+)"
ROUTES = [
    ("POST", re.compile(r"/api/repos/create"), "create_repo"),
    ("POST", re.compile(r"/api/validate-yaml"), "validate_yaml"),
    ("POST", re.compile(rf"/api/models/{REPO}/preupload/(?P<revision>[^/]+)"), "preupload"),
    ("POST", re.compile(rf"/api/models/{REPO}/commit/(?P<revision>[^/]+)"), "commit"),
    ("POST", re.compile(rf"/api/models/{REPO}/branch/(?P<branch>[^/]+)"), "create_branch"),
    ("GET", re.compile(rf"/api/models/{REPO}(?:/revision/(?P<revision>[^/]+))?"), "repo_info"),
    ("POST", re.compile(rf"/{REPO}\.git/info/lfs/objects/batch"), "lfs_batch"),
    ("POST", re.compile(rf"/{REPO}\.git/info/lfs/objects/verify"), "lfs_verify"),
    ("PUT", re.compile(r"/lfs-storage/(?P<oid>[0-9a-f]{64})"), "lfs_put"),
]


@dataclass
class Commit:
    repo_id: str
    revision: str
    oid: str
    summary: str
    description: str
    added: dict[str, bytes]  # path -> content, for the files this commit added or changed
    deleted: list[str]


@dataclass
class Repo:
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=dict)  # branch -> {path: content}
    heads: dict[str, str] = field(default_factory=dict)  # branch -> commit oid


class HubError(Exception):
    def __init__(self, status: int, message: str, error_code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.error_code = status, message, error_code


def git_blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def is_lfs(path: str, sample: bytes, size: int) -> bool:
    name = path.rsplit("/", 1)[-1]
    matches = any(fnmatch.fnmatch(name if "/" not in p else path, p) for p in LFS_PATTERNS)
    return matches or size > LFS_SIZE_THRESHOLD or b"\0" in sample


class FakeHub:
    """The Hub's upload endpoints on 127.0.0.1; `commits`, `repos`, `lfs` and `requests` record what arrived."""

    def __init__(self, token: str = "hf_fake_write_token_0123456789", user: str = "trl-es-tester"):
        self.token, self.user = token, user
        self.repos: dict[str, Repo] = {}
        self.commits: list[Commit] = []
        self.lfs: dict[str, bytes] = {}  # sha256 -> content
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization header)
        self.unexpected: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def client_env(self) -> dict[str, str]:
        """The environment that sends a `huggingface_hub` client here (and nowhere else)."""
        return {
            "HF_ENDPOINT": self.url,
            "HF_TOKEN": self.token,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        }

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The repository's files at the head of `revision`."""
        return dict(self.repos[repo_id].branches[revision])

    def commits_to(self, repo_id: str) -> list[Commit]:
        return [commit for commit in self.commits if commit.repo_id == repo_id]

    # ----------------------------------------------------------------------------------------------------------------
    # Endpoints: each takes the route's groups and the request's JSON (or raw body) and returns (status, JSON)

    def create_repo(self, body: dict) -> tuple[int, dict]:
        repo_id = f"{body.get('organization') or self.user}/{body['name']}"
        url = f"{self.url}/{repo_id}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": url}
        self.repos[repo_id] = Repo(private=body.get("visibility") == "private")
        self._apply(repo_id, "main", "initial commit", "", {".gitattributes": GITATTRIBUTES}, [], new_branch=True)
        return 200, {"url": url, "name": repo_id}

    def validate_yaml(self, body: dict) -> tuple[int, dict]:
        content = body["content"]
        if content.startswith("---"):
            front_matter = content.split("---", 2)[1]
            try:
                yaml.safe_load(front_matter)
            except yaml.YAMLError as error:
                return 400, {"errors": [{"message": str(error)}], "warnings": []}
        return 200, {"errors": [], "warnings": []}

    def preupload(self, body: dict, repo: str, revision: str) -> tuple[int, dict]:
        tree = self._branch(repo, revision)
        files = []
        for file in body["files"]:
            lfs = is_lfs(file["path"], base64.b64decode(file["sample"]), file["size"])
            existing = tree.get(file["path"])
            oid = None if existing is None else hashlib.sha256(existing).hexdigest() if lfs else git_blob_oid(existing)
            files.append(
                {"path": file["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
            )
        return 200, {"files": files, "commitOid": self.repos[repo].heads[revision]}

    def lfs_batch(self, body: dict, repo: str) -> tuple[int, dict]:
        self._repo(repo)
        if body.get("ref"):
            self._branch(repo, body["ref"]["name"])
        objects = []
        for obj in body["objects"]:
            answer = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.lfs:
                answer["actions"] = {
                    "upload": {"href": f"{self.url}/lfs-storage/{obj['oid']}"},
                    "verify": {"href": f"{self.url}/{repo}.git/info/lfs/objects/verify"},
                }
            objects.append(answer)
        return 200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}

    def lfs_put(self, content: bytes, oid: str) -> tuple[int, dict]:
        if hashlib.sha256(content).hexdigest() != oid:
            raise HubError(400, f"The uploaded content's sha256 is not {oid}.")
        self.lfs[oid] = content
        return 200, {}

    def lfs_verify(self, body: dict, repo: str) -> tuple[int, dict]:
        content = self.lfs.get(body["oid"])
        if content is None or len(content) != body["size"]:
            raise HubError(422, f"Object {body['oid']} of size {body['size']} was not uploaded.")
        return 200, {}

    def commit(self, lines: list[dict], repo: str, revision: str) -> tuple[int, dict]:
        self._branch(repo, revision)
        header = next(line["value"] for line in lines if line["key"] == "header")
        if header.get("parentCommit") not in (None, self.repos[repo].heads[revision]):
            raise HubError(412, "A commit has happened since the parent commit. Please pull the latest changes.")
        added, deleted = {}, []
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                added[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                if value["oid"] not in self.lfs:
                    raise HubError(422, f"LFS file {value['path']} ({value['oid']}) was never uploaded.")
                added[value["path"]] = self.lfs[value["oid"]]
            elif key in ("deletedFile", "deletedFolder"):
                deleted.append(value["path"])
            elif key != "header":
                raise HubError(400, f"Unknown commit operation {key!r}.")
        oid = self._apply(repo, revision, header["summary"], header.get("description", ""), added, deleted)
        return 200, {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid, "success": True}

    def create_branch(self, body: dict, repo: str, branch: str) -> tuple[int, dict]:
        state = self._repo(repo)
        if branch in state.branches:
            raise HubError(409, f"Reference refs/heads/{branch} already exists")
        start = body.get("startingPoint") or "main"
        state.branches[branch] = dict(self._branch(repo, start))
        state.heads[branch] = state.heads[start]
        return 200, {}

    def repo_info(self, body: dict, repo: str, revision: str | None) -> tuple[int, dict]:
        revision = revision or "main"
        tree = self._branch(repo, revision)
        siblings = [{"rfilename": path} for path in sorted(tree)]
        return 200, {
            "id": repo,
            "sha": self.repos[repo].heads[revision],
            "private": self.repos[repo].private,
            "siblings": siblings,
        }

    # ----------------------------------------------------------------------------------------------------------------

    def _repo(self, repo: str) -> Repo:
        if repo not in self.repos:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return self.repos[repo]

    def _branch(self, repo: str, revision: str) -> dict[str, bytes]:
        branches = self._repo(repo).branches
        if revision not in branches:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return branches[revision]

    def _apply(self, repo, revision, summary, description, added, deleted, new_branch=False) -> str:
        state = self.repos[repo]
        tree = {} if new_branch else dict(state.branches[revision])
        for path in deleted:
            tree = {
                name: content for name, content in tree.items() if name != path and not name.startswith(path + "/")
            }
        tree.update(added)
        oid = hashlib.sha1(f"{repo}@{revision}#{len(self.commits)}:{summary}".encode()).hexdigest()
        state.branches[revision], state.heads[revision] = tree, oid
        self.commits.append(Commit(repo, revision, oid, summary, description, added, deleted))
        return oid

    def handle(self, method: str, path: str, authorization: str | None, body: bytes) -> tuple[int, dict, dict]:
        """(status, JSON answer, headers) for one request."""
        path, _, query = path.partition("?")
        self.requests.append((method, path, authorization))
        if "create_pr=1" in query:
            self.unexpected.append(f"{method} {path}?{query}")
            return 501, {"error": "FakeHub does not open pull requests"}, {}
        routes = ((name, pattern.fullmatch(path)) for verb, pattern, name in ROUTES if verb == method)
        name, match = next(((name, match) for name, match in routes if match), (None, None))
        if match is None:
            self.unexpected.append(f"{method} {path}")
            return 404, {"error": f"FakeHub does not serve {method} {path}"}, {}
        if name != "lfs_put" and authorization != f"Bearer {self.token}":
            return 401, {"error": "Invalid credentials in Authorization header"}, {}
        groups = {key: value and unquote(value) for key, value in match.groupdict().items()}
        if name == "lfs_put":
            payload = body
        elif name == "commit":
            payload = [json.loads(line) for line in body.splitlines() if line.strip()]
        else:
            payload = json.loads(body) if body else {}
        try:
            with self._lock:
                status, answer = getattr(self, name)(payload, **groups)
        except HubError as error:
            headers = {"X-Error-Message": error.message}
            if error.error_code:
                headers["X-Error-Code"] = error.error_code
            return error.status, {"error": error.message}, headers
        return status, answer, {}


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    chunk = self.rfile.read(size)
                    self.rfile.readline()
                    if size == 0:
                        return b"".join(chunks)
                    chunks.append(chunk)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _serve(self):
            status, answer, headers = hub.handle(
                self.command, self.path, self.headers.get("Authorization"), self._body()
            )
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_HEAD = _serve

        def log_message(self, *args):  # quiet
            pass

    return Handler
