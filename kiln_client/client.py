"""`kiln_client.Client`: the REST API (`/api/v1/`, docs/api.md) from Python, with the agent's retries.

    import kiln_client
    client = kiln_client.Client("http://127.0.0.1:8000", token="kiln_pat_…")
    model = client.upload_model("digits.onnx")
    job = client.create_job(model_version=model["versions"][0]["id"], precisions=["fp32", "int8"], ...)
    job = client.wait_for_job(job["id"])

Retries (connection errors, 429 and 5xx, capped exponential backoff with jitter, Retry-After)
come from the `HttpClient` the agent uses too (kiln_contract.http); any other 4xx raises `ApiError` with the server's message and
code. Uploads are resumable (tus): a dropped connection resumes where the server stands, and the
file's sha256 is checked by the server against the assembled file. No Django import here.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

from kiln_contract.http import ApiError, HttpClient, RetryPolicy, ServerUnavailable
from kiln_contract.resumable import DEFAULT_CHUNK_BYTES, upload_file

__all__ = ["ApiError", "Client", "ClientConfig", "ServerUnavailable", "TERMINAL_STATUSES"]

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "canceled"})
CONFIG_ENV = "KILN_CLIENT_CONFIG"
DEFAULT_CONFIG = Path("~/.config/kiln/client.json")

Progress = Callable[[int, int], None]


class ModelVersion(TypedDict, total=False):
    id: int
    model: int
    number: int
    sha256: str
    size_bytes: int
    signature: dict
    op_histogram: dict[str, int]
    download_url: str


class Model(TypedDict, total=False):
    id: int
    name: str
    latest_version: ModelVersion | None
    versions: list[ModelVersion]


class Dataset(TypedDict, total=False):
    id: int
    name: str
    kind: str
    samples: int
    arrays: dict
    has_labels: bool
    sha256: str


class Job(TypedDict, total=False):
    id: int
    status: str
    stage: str
    progress: float
    error: str | None
    model_version: int
    precisions: list[str]
    tolerance: dict
    stages: list[dict]
    events: list[dict]
    variants: list[dict]
    device_tasks: list[dict]
    rerun_of: int | None
    toolchain: dict


class Report(TypedDict, total=False):
    job: int
    status: str
    tolerance: dict
    devices: list[dict]
    rerun: dict | None


class Measurement(TypedDict, total=False):
    id: int
    job: int | None
    model: dict
    variant_key: str
    precision: str
    backend: str
    backend_version: str
    agent: dict
    latency_ms: dict
    regression: dict | None
    measured_at: str


class ClientConfig:
    """Where `kiln login` keeps the server and token (mode 0600); KILN_SERVER / KILN_TOKEN win over it."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG).expanduser()

    def load(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def save(self, *, server: str, token: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"server": server, "token": token}, handle)
        os.chmod(self.path, 0o600)


class Client(HttpClient):
    """Typed calls of the REST API; each method mirrors one route of docs/api.md."""

    api_prefix = "/api/v1/"
    user_agent = "kiln-client"

    def __init__(self, server: str | None = None, token: str | None = None, *, retry: RetryPolicy | None = None,
                 timeout_s: float = 60.0, config: ClientConfig | None = None, **kwargs):
        saved = (config or ClientConfig()).load()
        server = server or os.environ.get("KILN_SERVER") or saved.get("server")
        token = token or os.environ.get("KILN_TOKEN") or saved.get("token")
        if not server:
            raise ValueError("No Kiln server: pass server=, set KILN_SERVER, or run `kiln login`.")
        super().__init__(server, token, retry=retry, timeout_s=timeout_s, **kwargs)

    # -- plumbing ------------------------------------------------------------------------------

    def get(self, path: str, **params) -> Any:
        return self._json(self.request("GET", path, params={k: v for k, v in params.items() if v is not None} or None))

    def post(self, path: str, body: dict | None = None) -> Any:
        return self._json(self.request("POST", path, json=body if body is not None else {}))

    def paginate(self, path: str, **params) -> Iterator[dict]:
        """Every row of a paginated list, page after page."""
        page = 1
        while True:
            answer = self.get(path, page=page, **params)
            if isinstance(answer, list):
                yield from answer
                return
            yield from answer.get("results", [])
            if not answer.get("next"):
                return
            page += 1

    def upload(self, path: str | Path, *, progress: Progress | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> dict:
        """Upload a file resumably; returns the finished upload (`{"id", "sha256", ...}`)."""
        return upload_file(self, Path(path), create_path="uploads/", progress=progress, chunk_bytes=chunk_bytes)

    # -- account -------------------------------------------------------------------------------

    def me(self) -> dict:
        return self.get("auth/me/")

    def login(self, username: str, password: str, *, token_name: str = "kiln cli") -> str:
        """Sign in with a password and make an API token for this client; returns the token."""
        self.request("GET", "auth/csrf/", authenticated=False)
        headers = {"X-CSRFToken": self.session.cookies.get("csrftoken", ""), "Referer": self.server + "/"}
        self.request("POST", "auth/login/", json={"username": username, "password": password}, headers=headers, authenticated=False)
        headers["X-CSRFToken"] = self.session.cookies.get("csrftoken", "")
        answer = self._json(self.request("POST", "tokens/", json={"name": token_name, "expires_in_days": None}, headers=headers, authenticated=False))
        self.session.cookies.clear()
        self.token = answer["token"]
        return self.token

    # -- registry ------------------------------------------------------------------------------

    def models(self, search: str = "") -> list[Model]:
        return list(self.paginate("models/", search=search or None))

    def model(self, model_id: int) -> Model:
        return self.get(f"models/{model_id}/")

    def upload_model(self, path: str | Path, *, name: str | None = None, progress: Progress | None = None) -> Model:
        upload = self.upload(path, progress=progress)
        return self.post("models/", {"name": name or Path(path).stem, "upload": upload["id"]})

    def upload_model_version(self, model_id: int, path: str | Path, *, progress: Progress | None = None) -> ModelVersion:
        upload = self.upload(path, progress=progress)
        return self.post(f"models/{model_id}/versions/", {"upload": upload["id"]})

    def datasets(self) -> list[Dataset]:
        return list(self.paginate("datasets/"))

    def dataset(self, dataset_id: int) -> Dataset:
        return self.get(f"datasets/{dataset_id}/")

    def upload_dataset(self, path: str | Path, *, kind: str, name: str | None = None, progress: Progress | None = None,
                       recipe: dict | None = None) -> Dataset:
        """An .npz (or a zip of samples), or raw data (a zip of images or WAV files, a .txt) with its `recipe`."""
        upload = self.upload(path, progress=progress)
        body = {"name": name or Path(path).stem, "kind": kind, "upload": upload["id"]}
        if recipe:
            body["recipe"] = json.dumps(recipe)
        return self.post("datasets/", body)

    def recipe_proposal(self, model_id: int, version_number: int) -> dict:
        """The recipe Kiln proposes for raw data fed to a model version: `{"recipe", "why", "input"}`."""
        return self.get(f"models/{model_id}/versions/{version_number}/recipe/")

    def preview_dataset(self, path: str | Path, *, recipe: dict, model_version: int | None = None) -> dict:
        """What `recipe` makes of the first files of a zip, and whether it fits the model version; nothing is kept."""
        upload = self.upload(path)
        body = {"upload": upload["id"], "recipe": json.dumps(recipe)}
        if model_version:
            body["model_version"] = model_version
        return self.post("datasets/preview/", body)

    # -- jobs ----------------------------------------------------------------------------------

    def create_job(self, *, model_version: int, precisions: list[str] | None = None, calibration_dataset: int | None = None,
                   validation_dataset: int | None = None, targets: list | None = None, tolerance: dict | None = None,
                   package: dict | None = None, budget_minutes: int | None = None) -> Job:
        body = {"model_version": model_version, "precisions": precisions or ["auto"], "calibration_dataset": calibration_dataset,
                "validation_dataset": validation_dataset, "targets": targets or [], "tolerance": tolerance or {}}
        if package:
            body["package"] = package
        if budget_minutes is not None:
            body["budget_minutes"] = budget_minutes
        return self.post("jobs/", body)

    def jobs(self) -> list[Job]:
        return list(self.paginate("jobs/"))

    def job(self, job_id: int) -> Job:
        return self.get(f"jobs/{job_id}/")

    def cancel_job(self, job_id: int) -> Job:
        return self.post(f"jobs/{job_id}/cancel/")

    def rerun_job(self, job_id: int) -> Job:
        """A new job with the same inputs; its report says what differed (toolchain, latency)."""
        return self.post(f"jobs/{job_id}/rerun/")

    def wait_for_job(self, job_id: int, *, poll_s: float = 2.0, timeout_s: float | None = None,
                     on_update: Callable[[Job], None] | None = None) -> Job:
        """Poll until the job ends; `on_update` sees every answer (for progress displays)."""
        deadline = time.monotonic() + timeout_s if timeout_s else None
        while True:
            job = self.job(job_id)
            if on_update:
                on_update(job)
            if job["status"] in TERMINAL_STATUSES:
                return job
            if deadline and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job['status']} after {timeout_s:.0f} s")
            self.sleep(poll_s)

    def report(self, job_id: int) -> Report:
        return self.get(f"jobs/{job_id}/report/")

    def artifacts(self, job_id: int) -> list[dict]:
        return self.get(f"jobs/{job_id}/artifacts/")

    def download_artifact(self, artifact: dict, directory: str | Path) -> Path:
        """Save an artifact (or a report's package entry) under its name; checks the sha256 when known."""
        target = Path(directory) / Path(artifact["name"]).name
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = self.download(artifact["download_url"], target)
        if artifact.get("sha256") and artifact["sha256"] != digest:
            target.unlink(missing_ok=True)
            raise ApiError(502, f"{artifact['name']} arrived with sha256 {digest}, not {artifact['sha256']}", "digest_mismatch")
        return target

    # -- performance database ------------------------------------------------------------------

    def performance(self, *, limit: int | None = None, **filters) -> list[Measurement]:
        """Measurements across jobs; filters as in docs/api.md (model, agent, backend, precision, regression…)."""
        rows = []
        for row in self.paginate("performance/", **{k: v for k, v in filters.items() if v is not None}):
            rows.append(row)
            if limit and len(rows) >= limit:
                break
        return rows

    def estimate(self, model_version: int) -> dict:
        """Latency estimates per known device, from per-operator timings already measured."""
        return self.get("performance/estimate/", model_version=model_version)

    # -- fleet and packages --------------------------------------------------------------------

    def agents(self) -> list[dict]:
        return list(self.paginate("agents/"))

    def agent_setup(self) -> dict:
        """The server's address as devices reach it (with a warning when loopback) and the agent's install command."""
        return self.get("agents/setup/")

    def create_registration_token(self, name: str, *, expires_in_days: int | None = None) -> dict:
        """A registration token for new devices (the secret is in this answer only) with its register command; with
        `expires_in_days`, it enrols no device after that many days."""
        body = {"name": name, **({"expires_in_days": expires_in_days} if expires_in_days else {})}
        return self.post("agents/registration-tokens/", body)

    def package_signing_key(self) -> str:
        """The server's Ed25519 public key (PEM) that signs deployment packages."""
        return self.get("packages/signing-key/")["public_key_pem"]

    def package_key(self) -> str:
        """The organization's AES-256-GCM key (base64) that opens encrypted packages."""
        return self.get("packages/key/")["key"]
