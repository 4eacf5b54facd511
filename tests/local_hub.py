"""A Hub on loopback for push tests: the endpoints huggingface_hub's own client calls to create a model repo and
commit a folder to it (create, repo info, the model card's metadata check, preupload, the Git LFS batch API with
basic transfers, the LFS upload, the commit), keeping every commit's files as the Hub would: regular files from the
commit's body, LFS files from their uploads, checked against the sha256 and size the commit names.

Only 127.0.0.1; it answers at most ``max_requests`` requests and stops by itself after ``lifetime`` seconds. Start it
with ``with LocalHub() as hub:`` and point a client at it with ``HF_ENDPOINT=hub.endpoint`` (read when
huggingface_hub is imported: run the client in a subprocess) and ``HF_HUB_DISABLE_XET=1`` (Xet storage needs a CAS
service this stand-in does not have; LFS basic transfer is the Hub's other upload protocol).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

LFS_SUFFIXES = (".safetensors", ".bin", ".png", ".pt")  # uploaded through LFS, as the Hub's .gitattributes says


@dataclass
class Commit:
    message: str
    files: dict[str, bytes]  # the repo's whole tree after the commit
    added_regular: list[str] = field(default_factory=list)
    added_lfs: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


@dataclass
class Repo:
    repo_id: str
    commits: list[Commit] = field(default_factory=list)

    @property
    def files(self) -> dict[str, bytes]:
        return self.commits[-1].files if self.commits else {}


class LocalHub:
    def __init__(self, max_requests: int = 500, lifetime: float = 900.0) -> None:
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}  # sha256 -> uploaded bytes
        self.lfs_uploads: list[str] = []  # sha256 of each LFS upload, in order
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.validated_cards: list[str] = []  # each model card the client had checked
        self.max_requests = max_requests
        self.lifetime = lifetime
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.lock = threading.Lock()

    def __enter__(self) -> LocalHub:
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.timer = threading.Timer(self.lifetime, self.server.shutdown)
        self.timer.daemon = True
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    # --- what each endpoint does: (status, JSON answer) ---

    def create(self, body: dict) -> tuple[int, dict]:
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": f"{self.endpoint}/{repo_id}"}
        self.repos[repo_id] = Repo(repo_id)
        return 200, {"url": f"{self.endpoint}/{repo_id}", "name": repo_id}

    def info(self, repo_id: str) -> tuple[int, dict]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return 404, {"error": f"Repository {repo_id} not found"}
        siblings = [{"rfilename": path} for path in sorted(repo.files)]
        head = self._head(repo)
        return 200, {"id": repo_id, "modelId": repo_id, "sha": head, "siblings": siblings, "private": False}

    def validate_yaml(self, body: dict) -> tuple[int, dict]:
        """A model card's metadata: the YAML block that opens it must be a mapping, with the list and text fields the
        Hub reads typed as it expects."""
        self.validated_cards.append(body["content"])
        match = re.match(r"---\n(.*?)\n---\n", body["content"], re.DOTALL)
        if match is None:
            return 200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata in repo card"}]}
        try:
            metadata = yaml.safe_load(match[1])
        except yaml.YAMLError as error:
            return 400, {"errors": [{"message": f"the card's YAML does not parse: {error}"}]}
        if not isinstance(metadata, dict):
            return 400, {"errors": [{"message": "the card's YAML must be a mapping"}]}
        wrong = [k for k in ("tags", "datasets") if k in metadata and not isinstance(metadata[k], list | str)]
        texts = ("library_name", "license", "pipeline_tag")
        wrong += [k for k in texts if k in metadata and not isinstance(metadata[k], str)]
        if wrong:
            return 400, {"errors": [{"message": f'"{key}" has the wrong type'} for key in wrong]}
        return 200, {"errors": [], "warnings": []}

    def preupload(self, body: dict) -> tuple[int, dict]:
        modes = []
        for f in body["files"]:
            mode = "lfs" if f["path"].endswith(LFS_SUFFIXES) else "regular"
            modes.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False})
        return 200, {"files": modes}

    def lfs_batch(self, body: dict) -> tuple[int, dict]:
        objects = []
        for obj in body["objects"]:
            answer = {"oid": obj["oid"], "size": obj["size"]}
            if obj["oid"] not in self.lfs:  # a stored object is not uploaded again, as on the Hub
                answer["actions"] = {"upload": {"href": f"{self.endpoint}/lfs-upload/{obj['oid']}"}}
            objects.append(answer)
        return 200, {"transfer": "basic", "objects": objects}

    def lfs_upload(self, oid: str, data: bytes) -> tuple[int, dict]:
        if hashlib.sha256(data).hexdigest() != oid:
            return 400, {"error": "the uploaded bytes do not match their sha256"}
        self.lfs[oid] = data
        self.lfs_uploads.append(oid)
        return 200, {}

    def commit(self, repo_id: str, lines: list[dict]) -> tuple[int, dict]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return 404, {"error": f"Repository {repo_id} not found"}
        files = dict(repo.files)
        commit = Commit(message="", files=files)
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "header":
                commit.message = value["summary"]
            elif key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
                commit.added_regular.append(value["path"])
            elif key == "lfsFile":
                data = self.lfs.get(value["oid"])
                if data is None or len(data) != value["size"]:
                    return 422, {"error": f"LFS object {value['oid']} of {value['path']} was never uploaded"}
                files[value["path"]] = data
                commit.added_lfs.append(value["path"])
            elif key in ("deletedFile", "deletedFolder"):
                prefix = value["path"]
                for path in [p for p in files if p == prefix or p.startswith(prefix.rstrip("/") + "/")]:
                    del files[path]
                    commit.deleted.append(path)
            else:
                return 400, {"error": f"unknown commit line {key!r}"}
        repo.commits.append(commit)
        head = self._head(repo)
        return 200, {"commitUrl": f"{self.endpoint}/{repo_id}/commit/{head}", "commitOid": head}

    @staticmethod
    def _head(repo: Repo) -> str:
        return hashlib.sha1(str(len(repo.commits)).encode()).hexdigest()

    # --- routing ---

    def route(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        path = path.split("?")[0]
        if method == "POST" and path == "/api/repos/create":
            return self.create(json.loads(body))
        if method == "POST" and path == "/api/validate-yaml":
            return self.validate_yaml(json.loads(body))
        if method == "GET" and (m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)):
            return self.info(m[1])
        if method == "POST" and re.fullmatch(r"/api/models/[^/]+/[^/]+/preupload/[^/]+", path):
            return self.preupload(json.loads(body))
        if method == "POST" and re.fullmatch(r"/[^/]+/[^/]+\.git/info/lfs/objects/batch", path):
            return self.lfs_batch(json.loads(body))
        if method == "PUT" and (m := re.fullmatch(r"/lfs-upload/([0-9a-f]{64})", path)):
            return self.lfs_upload(m[1], body)
        if method == "POST" and (m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/[^/]+", path)):
            return self.commit(m[1], [json.loads(line) for line in body.splitlines() if line.strip()])
        return 404, {"error": f"the local Hub has no {method} {path}"}

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self._body()
                with hub.lock:
                    if len(hub.requests) >= hub.max_requests:
                        status, answer = 503, {"error": "the local Hub answered its last request"}
                    else:
                        status, answer = hub.route(self.command, self.path, body)
                    hub.requests.append((self.command, self.path.split("?")[0], status))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                    return self.rfile.read(int(self.headers.get("Content-Length") or 0))
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()  # the CRLF after each chunk
                self.rfile.readline()  # the CRLF after the last, empty chunk
                return b"".join(chunks)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args) -> None:  # quiet: the test reads hub.requests
                pass

        return Handler
