"""Issue 13 item 7: one key cannot fill the disk, and a full disk fails one job cleanly.

The full disk is real: a 1.6 MB tmpfs mounted for the test holds the artifacts and work folders
(the database and uploads stay elsewhere, as the deployment keeps them on their own volume). The
kernel answers ENOSPC to the real worker's real writes (safetensors, torch.save, json), exactly as
a full volume would; nothing in the code under test is patched or told that the disk is small."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile

import pytest

from .conftest import QUICK_EVAL, SHORT, TINY_MODEL, open_service


def _mount_tmpfs(mount, size: str):
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"the full-disk tests mount a small tmpfs and need root (or CAP_SYS_ADMIN) for it: {done.stderr}", pytrace=False)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


@pytest.fixture()
def small_disk(tmp_path):
    yield from _mount_tmpfs(tmp_path / "small-disk", "1600k")


@pytest.fixture()
def tiny_disk(tmp_path):
    yield from _mount_tmpfs(tmp_path / "tiny-disk", "8k")


def test_a_checkpoint_that_hits_a_full_disk_is_recognised_though_torch_does_not_say_so(fault_settings, tiny_disk):
    """torch.save reports ENOSPC only as "unexpected pos"; the worker tells it by the disk it left
    full. A real torch.save on a real 8 kB tmpfs, and the same error text on a roomy disk."""
    import torch

    from worker.runner import disk_full

    settings = fault_settings.model_copy(update={"work_dir": tiny_disk})
    (tiny_disk / "job_x").mkdir()
    with pytest.raises(RuntimeError) as raised:
        torch.save({"rows": torch.zeros(10_000)}, tiny_disk / "job_x" / "rows_checkpoint.pt")
    assert "No space" not in str(raised.value) and getattr(raised.value, "errno", None) is None
    assert disk_full(raised.value, settings, "job_x")
    roomy = fault_settings.model_copy(update={"work_dir": fault_settings.data_dir / "work"})
    (roomy.work_dir / "job_x").mkdir(parents=True)
    assert not disk_full(raised.value, roomy, "job_x")
    assert not disk_full(raised.value, settings, "job_x", by_free_space=False)  # a failing request is judged by its error alone


def _download_in_two_ranges(service, job: dict) -> bytes:
    archive = service.client.get(f"/jobs/{job['id']}/artifacts", headers=service.auth).json()["archive"]
    half = archive["size"] // 2
    first = service.client.get(archive["url"], headers={**service.auth, "Range": f"bytes=0-{half - 1}"})
    rest = service.client.get(archive["url"], headers={**service.auth, "Range": f"bytes={half}-"})
    assert first.status_code == rest.status_code == 206
    data = first.content + rest.content
    assert len(data) == archive["size"] and hashlib.sha256(data).hexdigest() == archive["sha256"]
    return data


def test_a_full_disk_fails_the_one_job_cleanly_and_the_next_job_runs(fault_settings, small_disk):
    """Honest because the disk is really full: a kernel tmpfs of 1.6 MB answers the real worker's
    writes with ENOSPC (here safetensors saving the adapter), as any full volume would."""
    settings = fault_settings.model_copy(update={
        "artifacts_dir": small_disk / "artifacts", "work_dir": small_disk / "work",
        "max_stored_bytes_per_key": 100_000,  # smaller than one finished tiny model
    })
    with open_service(settings) as service:
        service.start_worker()
        # padded to 4,096 rows its model and adapter (3.2 MB) cannot fit on the 1.6 MB disk
        big = service.submit({"base_model": TINY_MODEL, "terms": ["hypertext"], "pad_to_multiple_of": 4096, "training": SHORT, "evaluation": QUICK_EVAL})
        failed = service.wait_for_status(big["id"], {"succeeded", "failed"}, 120)
        assert failed["status"] == "failed" and failed["error"]["code"] == "disk_full", failed
        assert "nothing of it was kept" in failed["error"]["message"] and str(small_disk) not in failed["error"]["message"]
        for path in (f"/jobs/{big['id']}/archive", f"/jobs/{big['id']}/artifacts", f"/jobs/{big['id']}/artifacts/config.json"):
            assert service.client.get(path, headers=service.auth).json()["error"]["code"] == "job_not_succeeded"
        assert not (small_disk / "artifacts" / big["id"]).exists() and not (small_disk / "work" / big["id"]).exists()
        assert shutil.disk_usage(small_disk).used < 200_000  # its partial files are gone

        # A failed job keeps no bytes, so the key is still under its storage limit; the same worker,
        # on the same disk, runs the next job.
        small = service.submit({"base_model": TINY_MODEL, "terms": ["hypertext"], "training": SHORT, "evaluation": QUICK_EVAL})
        done = service.wait_for_status(small["id"], {"succeeded", "failed"}, 120)
        assert done["status"] == "succeeded", done
        data = _download_in_two_ranges(service, done)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = tar.getnames()
            assert f"{small['id']}/model.safetensors" in names and f"{small['id']}/manifest.json" in names
        # one copy of the model: the folder; the archive is streamed from it
        assert [p.name for p in (small_disk / "artifacts" / small["id"]).iterdir()] == ["model"]

        # Now the key keeps more than its limit: no new job until it deletes one.
        refused = service.client.post("/extend", json={"base_model": TINY_MODEL, "terms": ["hyperlink"]}, headers=service.auth)
        assert refused.status_code == 507, refused.text
        error = refused.json()["error"]
        assert error["code"] == "storage_quota_exceeded" and "DELETE /jobs/{id}" in error["message"] and "100.0 kB" in error["message"]
        assert service.client.delete(f"/jobs/{small['id']}", headers=service.auth).status_code == 204
        service.submit({"base_model": TINY_MODEL, "terms": ["hyperlink"], "training": SHORT, "evaluation": QUICK_EVAL})


def test_uploads_count_against_the_key_storage_limit(fault_settings):
    settings = fault_settings.model_copy(update={"max_stored_bytes_per_key": 4000})
    corpus = ("a document about hypertext and hyperlinks\n\n" * 48).encode()[:2000]
    with open_service(settings) as service:
        for _ in range(2):  # 0 then 2,000 bytes kept: both fit under the limit
            assert service.client.post("/files", files={"file": ("c.txt", corpus)}, headers=service.auth).status_code == 201
        refused = service.client.post("/files", files={"file": ("c.txt", corpus)}, headers=service.auth)
        assert refused.status_code == 507 and refused.json()["error"]["code"] == "storage_quota_exceeded"
        assert "keeps 4.0 kB" in refused.json()["error"]["message"] and "limit is 4.0 kB" in refused.json()["error"]["message"]
        job = service.client.post("/extend", json={"base_model": TINY_MODEL, "terms": ["hypertext"]}, headers=service.auth)
        assert job.status_code == 507
        # another key is not affected
        from app.db.keys import create_key

        with service.app.state.sessions() as session:
            other = {"Authorization": f"Bearer {create_key(session, 'other')[1]}"}
        assert service.client.post("/files", files={"file": ("c.txt", corpus)}, headers=other).status_code == 201


def test_a_key_may_have_only_so_many_jobs_in_flight(fault_settings):
    settings = fault_settings.model_copy(update={"max_active_jobs_per_key": 2})
    body = {"base_model": TINY_MODEL, "terms": ["hypertext"]}
    with open_service(settings) as service:  # no worker: submitted jobs stay queued
        first = service.client.post("/extend", json=body, headers={**service.auth, "Idempotency-Key": "one"}).json()
        service.submit(body)
        refused = service.client.post("/extend", json=body, headers=service.auth)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "too_many_active_jobs" and "limit is 2" in error["message"] and "cancel" in error["message"]
        # a retry of an accepted job is not a new job
        replay = service.client.post("/extend", json=body, headers={**service.auth, "Idempotency-Key": "one"})
        assert replay.status_code == 202 and replay.json()["id"] == first["id"]
        service.cancel(first["id"])
        service.submit(body)


def test_at_the_job_limit_a_request_that_is_invalid_anyway_is_422_not_429(fault_settings):
    """Issue 25 item 5: waiting would only turn the 429 into a 422, so the request is validated
    whole before the key's jobs are counted; a valid one is refused without leaving its inline
    corpus on disk."""
    settings = fault_settings.model_copy(update={"max_active_jobs_per_key": 1})
    with open_service(settings) as service:  # no worker: the first job stays queued
        service.submit({"base_model": TINY_MODEL, "terms": ["hypertext"]})
        uploads = set(settings.resolved_uploads_dir.iterdir())
        invalid = [
            ({"base_model": TINY_MODEL, "terms": [f"hypertext{i}" for i in range(10_000)]}, "terms"),
            ({"base_model": "C:\\Windows", "terms": ["hypertext"]}, "base_model"),
            ({"base_model": TINY_MODEL, "terms": ["hypertext"], "training": {"steps": settings.max_steps + 1}}, "training.steps"),
            ({"base_model": TINY_MODEL, "corpus_text": " \n\n "}, "corpus_text"),
            ({"base_model": TINY_MODEL, "corpus_file_id": "file_0123"}, "corpus_file_id"),
        ]
        for body, param in invalid:
            response = service.client.post("/extend", json=body, headers=service.auth)
            assert response.status_code == 422, (param, response.status_code, response.text[:300])
            assert response.json()["error"]["param"] == param, response.text[:300]
        valid = {"base_model": TINY_MODEL, "corpus_text": "hypertext documents link to other documents\n\n" * 40}
        refused = service.client.post("/extend", json=valid, headers=service.auth)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_active_jobs", refused.text
        assert set(settings.resolved_uploads_dir.iterdir()) == uploads  # the refused job's inline corpus is not kept
