"""A Python client for the TIDE HTTP API, as any outside user would call it (httpx only).

    from app.client import TideClient
    tide = TideClient()                                  # TIDE_URL and TIDE_API_KEY from the environment
    job = tide.submit("smollm2-135m", terms=["immunohistochemistry"], options={"training": {"steps": 50}})
    job = tide.wait(job["id"])                           # a progress bar on stderr
    folder = tide.download(job["id"], "models/")         # resumable, sha256-checked, unpacked

It imports nothing from the server (no FastAPI, database or torch), so it runs anywhere Python
and httpx do; `tide jobs ...` (app/cli_jobs.py) is a thin command line over it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

URL_ENV = "TIDE_URL"
KEY_ENV = "TIDE_API_KEY"
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
_CHUNK = 1 << 16


class ClientError(Exception):
    """The server's error ({code, message, param}) or a problem on this side (code names it)."""

    def __init__(self, code: str, message: str, param: str | None = None, status: int | None = None):
        super().__init__(message)
        self.code, self.message, self.param, self.status = code, message, param, status

    def __str__(self) -> str:
        where = f" ({self.param})" if self.param else ""
        return f"{self.code}{where}: {self.message}"


class ChecksumError(ClientError):
    def __init__(self, path: Path, expected: str, actual: str):
        super().__init__(
            "checksum_mismatch",
            f"{path} has sha256 {actual} but the manifest says {expected}; the download is corrupt "
            "and was deleted — run the download again to fetch it afresh",
            str(path),
        )
        self.path, self.expected, self.actual = path, expected, actual


@dataclass
class Download:
    folder: Path | None  # the unpacked model folder (None with extract=False)
    archive: Path
    size: int
    sha256: str
    resumed_from: int  # bytes already on disk from an interrupted download
    received: int  # bytes fetched by this call


def _read_utf8(path: str | Path, what: str, code: str, param: str) -> str:
    """A local file's text (UTF-8, BOM allowed), or a ClientError naming `what` file and the fix."""
    try:
        return Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ClientError(code, f"{what} file {path} is not UTF-8 (byte offset {exc.start}); save it as UTF-8", param) from None
    except OSError as exc:
        raise ClientError(code, f"cannot read {what} file {path}: {exc.strerror}", param) from None


def read_terms_file(path: str | Path) -> list[str]:
    """One term per line (UTF-8, BOM allowed); surrounding whitespace stripped, blank lines skipped."""
    text = _read_utf8(path, "terms", "invalid_terms", "terms")
    return [line.strip() for line in text.splitlines() if line.strip()]


def read_examples_file(path: str | Path, text_field: str = "text") -> list[str]:
    """A few documents of the user's own text: JSONL (one object per line, its `text_field`), else
    UTF-8 text with documents between blank lines. The server checks the rest."""
    text = _read_utf8(path, "examples", "invalid_corpus", "examples")
    if str(path).endswith(".jsonl"):
        try:
            return [json.loads(line)[text_field] for line in text.splitlines() if line.strip()]
        except (ValueError, KeyError, TypeError):
            raise ClientError("invalid_corpus", f"examples file {path}: every line must be a JSON object with a string "
                              f"field {text_field!r}", "examples") from None
    return [doc.strip() for doc in re.split(r"\n\s*\n", text) if doc.strip()]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class TideClient:
    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ):
        url = url or os.environ.get(URL_ENV)
        api_key = api_key or os.environ.get(KEY_ENV)
        if not url:
            raise ClientError("missing_url", f"no server URL: pass --url / url=, or set {URL_ENV} (e.g. http://127.0.0.1:8000)", "url")
        if not api_key:
            raise ClientError("missing_api_key", f"no API key: set {KEY_ENV} (or pass --api-key / api_key=); create one with `tide keys create NAME`", "api_key")
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {api_key}", "User-Agent": "tide-client/0.1"},
            timeout=timeout, transport=transport, follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "TideClient":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # ---- plumbing -----------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ClientError("connection_failed", f"cannot reach {self.url} ({exc}); is the server running and {URL_ENV} right?", "url") from None
        if response.status_code >= 400:
            raise self._error(response)
        return response

    @staticmethod
    def _error(response: httpx.Response) -> ClientError:
        try:
            body = response.json()["error"]
            return ClientError(body.get("code", "error"), body.get("message", response.reason_phrase), body.get("param"), response.status_code)
        except (ValueError, KeyError, TypeError):
            return ClientError(f"http_{response.status_code}", f"the server answered {response.status_code} {response.reason_phrase}", None, response.status_code)

    def _json(self, method: str, path: str, **kwargs) -> Any:
        response = self._request(method, path, **kwargs)
        return None if response.status_code == 204 else response.json()

    # ---- the API ------------------------------------------------------------------------------

    def models(self) -> list[dict]:
        return self._json("GET", "/models")["data"]

    def upload(self, path: str | Path, text_field: str | None = None) -> dict:
        """POST /files: a corpus (UTF-8 text, documents between blank lines, or .jsonl)."""
        path = Path(path)
        if not path.is_file():
            raise ClientError("invalid_corpus", f"corpus file {path} does not exist", "corpus")
        data = {"text_field": text_field} if text_field else None
        with path.open("rb") as handle:
            return self._json("POST", "/files", files={"file": (path.name, handle, "application/octet-stream")}, data=data)

    def files(self, limit: int = 100) -> list[dict]:
        """GET /files, every page: the key's stored corpora, newest first, each with the jobs that use it."""
        files: list[dict] = []
        cursor = None
        while True:
            params = {"limit": limit, **({"cursor": cursor} if cursor else {})}
            page = self._json("GET", "/files", params=params)
            files += page["data"]
            cursor = page["next_cursor"]
            if cursor is None:
                return files

    def file(self, file_id: str) -> dict:
        return self._json("GET", f"/files/{file_id}")

    def delete_file(self, file_id: str) -> None:
        """DELETE /files/{id}: its bytes leave the key's storage quota. A file a queued or running
        job uses raises ClientError (status 409, code file_in_use, the message names the job)."""
        self._json("DELETE", f"/files/{file_id}")

    def submit(
        self,
        base_model: str,
        *,
        terms: list[str] | None = None,
        examples: list[str] | None = None,
        corpus: str | Path | None = None,
        corpus_file_id: str | None = None,
        text_field: str | None = None,
        options: dict | None = None,
        idempotency_key: str | None = None,
    ) -> dict:
        """POST /extend. `corpus` is a local file, uploaded first; `options` are the request's
        other fields as the API names them, e.g. {"training": {"steps": 50}}."""
        body: dict[str, Any] = {"base_model": base_model, **(options or {})}
        if terms is not None:
            body["terms"] = list(terms)
        if examples is not None:
            body["examples"] = list(examples)
        if corpus is not None:
            corpus_file_id = self.upload(corpus, text_field)["id"]
        if corpus_file_id is not None:
            body["corpus_file_id"] = corpus_file_id
        if text_field is not None:
            body["corpus_text_field"] = text_field
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._json("POST", "/extend", json=body, headers=headers)

    def job(self, job_id: str) -> dict:
        return self._json("GET", f"/jobs/{job_id}")

    def jobs(self, status: str | None = None, limit: int = 20) -> list[dict]:
        params = {"limit": limit, **({"status": status} if status else {})}
        return self._json("GET", "/jobs", params=params)["data"]

    def events(self, job_id: str, after: int = 0, limit: int = 200) -> tuple[list[dict], int]:
        """(events newer than `after`, the `after` for the next call)."""
        page = self._json("GET", f"/jobs/{job_id}/events", params={"after": after, "limit": limit})
        return page["data"], page["next_after"]

    def follow_events(self, job_id: str, after: int = 0, poll_s: float = 1.0) -> Iterator[dict]:
        """Every event as it comes, until the job has finished and its last event was read."""
        while True:
            events, after = self.events(job_id, after)
            yield from events
            if not events:
                if self.job(job_id)["status"] in TERMINAL:
                    events, after = self.events(job_id, after)
                    yield from events
                    if not events:
                        return
                time.sleep(poll_s)

    def cancel(self, job_id: str) -> dict:
        return self._json("POST", f"/jobs/{job_id}/cancel")

    def delete(self, job_id: str) -> None:
        self._json("DELETE", f"/jobs/{job_id}")

    def manifest(self, job_id: str) -> dict:
        return self._json("GET", f"/jobs/{job_id}/artifacts")

    # ---- waiting ------------------------------------------------------------------------------

    def wait(self, job_id: str, *, progress: bool = True, poll_s: float = 1.0, timeout: float | None = None, stream=None) -> dict:
        """Poll until the job has finished; returns the job. A tqdm bar shows the training steps
        and the current stage and loss (progress=False for none)."""
        from tqdm import tqdm

        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        after = 0
        try:
            while True:
                job = self.job(job_id)
                if progress:
                    if bar is None:
                        bar = tqdm(total=job["progress"]["total"] or None, unit="step", file=stream or sys.stderr, desc=job_id[:12])
                    events, after = self.events(job_id, after, limit=1000)
                    loss = next((e["payload"].get("loss") for e in reversed(events) if e["kind"] == "progress"), None)
                    postfix = {"status": job["status"], "stage": job["stage"] or "-"}
                    if isinstance(loss, (int, float)):
                        postfix["loss"] = f"{loss:.4g}"
                    bar.set_postfix(postfix, refresh=False)
                    bar.update(job["progress"]["step"] - bar.n)
                if job["status"] in TERMINAL:
                    return job
                if deadline is not None and time.monotonic() > deadline:
                    raise ClientError("wait_timeout", f"job {job_id} is still {job['status']} after {timeout:.0f} s", "job_id")
                time.sleep(poll_s)
        finally:
            if bar is not None:
                bar.close()

    # ---- downloading --------------------------------------------------------------------------

    def download(
        self,
        job_id: str,
        dest: str | Path = ".",
        *,
        extract: bool = True,
        progress: bool = True,
        on_bytes: Callable[[int], None] | None = None,
        stream=None,
    ) -> Download:
        """Fetch the job's archive into `dest` and check its sha256 against the manifest.

        An interrupted download leaves `<job>.tar.partial`; the next call asks only for the
        missing bytes (HTTP Range). A file whose sha256 does not match is deleted and
        ChecksumError raised. With extract=True the archive is unpacked to `dest/<job>/` and
        every file checked against the manifest too. `on_bytes(total so far)` is called after
        each chunk written."""
        from tqdm import tqdm

        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        manifest = self.manifest(job_id)
        archive = manifest["archive"]
        size, expected = int(archive["size"]), archive["sha256"]
        target = dest / archive["filename"]
        partial = target.with_name(target.name + ".partial")
        if target.is_file() and target.stat().st_size == size and _sha256(target) == expected:
            resumed_from, received = size, 0
        else:
            resumed_from = partial.stat().st_size if partial.is_file() else 0
            if resumed_from > size:
                partial.unlink()
                resumed_from = 0
            received = self._fetch(archive["url"], partial, resumed_from, size, progress, on_bytes, stream, tqdm)
            actual = _sha256(partial)
            if actual != expected:
                partial.unlink()
                raise ChecksumError(target, expected, actual)
            os.replace(partial, target)
        folder = self._extract(target, dest, manifest) if extract else None
        return Download(folder, target, size, expected, resumed_from, received)

    def _fetch(self, url: str, partial: Path, start: int, size: int, progress: bool, on_bytes, stream, tqdm) -> int:
        if start >= size:
            return 0
        headers = {"Range": f"bytes={start}-"} if start else {}
        received = 0
        with self._http.stream("GET", url, headers=headers) as response:
            if response.status_code >= 400:
                response.read()
                raise self._error(response)
            if start and response.status_code != 206:
                start = 0  # the server sent the whole file: start over
            mode = "ab" if start else "wb"
            bar = tqdm(total=size, initial=start, unit="B", unit_scale=True, file=stream or sys.stderr, desc=partial.name.split(".")[0][:12], disable=not progress)
            try:
                with partial.open(mode) as handle:
                    for chunk in response.iter_bytes(_CHUNK):
                        handle.write(chunk)
                        received += len(chunk)
                        bar.update(len(chunk))
                        if on_bytes is not None:
                            on_bytes(start + received)
            finally:
                bar.close()
        return received

    @staticmethod
    def _extract(archive: Path, dest: Path, manifest: dict) -> Path:
        with tarfile.open(archive) as tar:
            roots = {Path(name).parts[0] for name in tar.getnames()}
            tar.extractall(dest, filter="data")
        if len(roots) != 1:
            raise ClientError("bad_archive", f"{archive} holds {len(roots)} top-level folders; expected one", str(archive))
        folder = dest / roots.pop()
        for entry in manifest["files"]:
            path = folder / entry["path"]
            if not path.is_file():
                raise ClientError("bad_archive", f"{path} is listed in the manifest but missing from the archive", entry["path"])
            actual = _sha256(path)
            if actual != entry["sha256"]:
                path.unlink()
                raise ChecksumError(path, entry["sha256"], actual)
        return folder
