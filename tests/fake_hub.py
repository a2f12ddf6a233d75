"""A local stand-in for the few Hugging Face Hub endpoints a push calls, served over HTTP.

The routes, and the JSON each reads and answers, are those huggingface_hub 2.4's
``HfApi`` uses (``hf_api.py``: ``create_repo``, ``dataset_info``, ``_validate_yaml``,
``create_commit``; ``_commit_api.py``: ``_fetch_upload_modes``, ``_send_commit``;
``lfs.py``: ``post_lfs_batch_info``, ``lfs_upload``; a commit adds and deletes files), with Git LFS for the files the
preupload answer marks ``lfs`` (Parquet and PNG files, as the Hub does for binary files;
Xet, which the Hub offers beside LFS, is turned off in the tests). Requests without the
token are answered 401; a commit whose parent is not the repo's head is answered 412.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Repo:
    private: bool
    files: dict[str, bytes] = field(default_factory=lambda: {".gitattributes": b"*.parquet filter=lfs\n"})
    sha: str = field(default_factory=lambda: secrets.token_hex(20))
    commits: list[dict] = field(default_factory=list)


class FakeHub:
    """The Hub's state (``repos``, uploaded LFS objects) and a server for it, on 127.0.0.1."""

    def __init__(self, token: str = "hf_fake"):
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.on_info: Callable[[Repo], None] | None = None  # run once a repo's info is sent (to race a push)
        hub = self

        class Handler(_Handler):
            state = hub

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


_DATASET = r"/api/datasets/(?P<repo>[^/]+/[^/]+)"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: FakeHub

    def log_message(self, *args: object) -> None:  # (quiet)
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, body: object = None, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body if body is not None else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self) -> None:
        self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def _route(self, method: str) -> None:
        hub, path = self.state, self.path.split("?")[0]
        hub.requests.append((method, path))
        body = self._body()
        if not path.startswith("/lfs/") and self.headers.get("Authorization") != f"Bearer {hub.token}":
            self._send(
                401,
                {"error": "Invalid credentials"},
                {"X-Error-Message": "Invalid credentials in Authorization header"},
            )
            return
        routes = [
            ("POST", r"/api/repos/create", self._create),
            ("GET", _DATASET, self._info),
            ("POST", r"/api/validate-yaml", lambda b: self._send(200, {"errors": [], "warnings": []})),
            ("POST", _DATASET + r"/preupload/main", self._preupload),
            ("POST", r"/datasets/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch", self._batch),
            ("PUT", r"/lfs/(?P<oid>[0-9a-f]{64})", self._upload),
            ("POST", r"/lfs-verify", self._verify),
            ("POST", _DATASET + r"/commit/main", self._commit),
        ]
        for verb, pattern, handler in routes:
            if verb == method and (match := re.fullmatch(pattern, path)):
                self.match = match
                handler(body)
                return
        self._send(404, {"error": f"no route {method} {path}"})

    def _repo(self) -> Repo | None:
        return self.state.repos.get(self.match["repo"])

    def _create(self, body: bytes) -> None:
        request = json.loads(body)
        assert request.get("type") == "dataset", request
        repo_id = f"{request['organization']}/{request['name']}"
        if repo_id in self.state.repos:
            self._send(
                409, {"error": "You already created this dataset repo", "url": f"{self.state.url}/datasets/{repo_id}"}
            )
            return
        self.state.repos[repo_id] = Repo(private=request.get("visibility") == "private")
        self._send(200, {"url": f"{self.state.url}/datasets/{repo_id}", "name": repo_id})

    def _info(self, body: bytes) -> None:
        repo = self._repo()
        if repo is None:
            return self._not_found()
        siblings = [{"rfilename": name} for name in sorted(repo.files)]
        self._send(200, {"id": self.match["repo"], "private": repo.private, "sha": repo.sha, "siblings": siblings})
        if self.state.on_info is not None:
            self.state.on_info(repo)

    def _preupload(self, body: bytes) -> None:
        if self._repo() is None:
            return self._not_found()
        files = json.loads(body)["files"]
        modes = [
            {"path": f["path"], "uploadMode": "lfs" if f["path"].endswith((".parquet", ".png")) else "regular"}
            for f in files
        ]
        self._send(200, {"files": [dict(m, shouldIgnore=False, oid=None) for m in modes]})

    def _batch(self, body: bytes) -> None:
        request = json.loads(body)
        objects = [
            {
                "oid": o["oid"],
                "size": o["size"],
                "actions": {
                    "upload": {"href": f"{self.state.url}/lfs/{o['oid']}"},
                    "verify": {"href": f"{self.state.url}/lfs-verify"},
                },
            }
            for o in request["objects"]
        ]
        self._send(200, {"transfer": "basic", "objects": objects})

    def _upload(self, body: bytes) -> None:
        oid = self.match["oid"]
        if hashlib.sha256(body).hexdigest() != oid:
            return self._send(400, {"error": "the content's sha256 is not the oid"})
        self.state.lfs[oid] = body
        self._send(200)

    def _verify(self, body: bytes) -> None:
        request = json.loads(body)
        stored = self.state.lfs.get(request["oid"])
        self._send(200 if stored is not None and len(stored) == request["size"] else 404)

    def _commit(self, body: bytes) -> None:
        repo = self._repo()
        if repo is None:
            return self._not_found()
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = lines[0]["value"]
        if header.get("parentCommit") not in (None, repo.sha):
            return self._send(412, {"error": "A commit has happened since. Please refresh and try again."})
        added: dict[str, bytes] = {}
        deleted: list[str] = []
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                added[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "lfsFile":
                if value["oid"] not in self.state.lfs:
                    return self._send(422, {"error": f"LFS object {value['oid']} was not uploaded"})
                added[value["path"]] = self.state.lfs[value["oid"]]
            elif line["key"] == "deletedFile":
                if value["path"] not in repo.files:
                    return self._send(404, {"error": f"{value['path']} does not exist"})
                deleted.append(value["path"])
            else:
                return self._send(400, {"error": f"unexpected {line['key']}"})
        for path in deleted:
            del repo.files[path]
        repo.files.update(added)
        repo.sha = secrets.token_hex(20)
        commit = {"summary": header["summary"], "description": header.get("description"), "files": added}
        repo.commits.append(commit | {"deleted": deleted})
        url = f"{self.state.url}/datasets/{self.match['repo']}/commit/{repo.sha}"
        self._send(200, {"success": True, "commitOid": repo.sha, "commitUrl": url})
