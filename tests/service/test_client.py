"""app.client and `tide jobs` against a real uvicorn, Redis, `tide worker` process and SQLite:
submit -> wait -> download -> load with transformers; an interrupted download resumes with
Range; a corrupted download is caught by its sha256; the CLI end to end."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

from .conftest import TINY_MODEL

pytestmark = pytest.mark.slow

TERMS = ["multiprogramming", "microprocessor", "hypertext"]
SMALL = {"training": {"steps": 6, "batch_size": 2, "seq_len": 64, "warmup_steps": 0, "checkpoint_every": 3}, "evaluation": {"max_bytes": 4000}}


@pytest.fixture(scope="module")
def tide(live_server, api_key):
    from app.client import TideClient

    with TideClient(live_server, api_key) as client:
        yield client


@pytest.fixture(scope="module")
def finished_job(tide) -> dict:
    job = tide.submit(TINY_MODEL, terms=TERMS, options=SMALL)
    bar = io.StringIO()
    done = tide.wait(job["id"], poll_s=0.3, timeout=240, stream=bar)
    assert done["status"] == "succeeded", done["error"]
    # the progress bar ran to the last step and showed the status
    assert "6/6" in bar.getvalue() and "succeeded" in bar.getvalue()
    return done


def test_the_client_imports_nothing_of_the_server():
    code = (
        "import sys, app.client; "
        "leaked = sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'starlette', 'sqlalchemy', 'torch', 'extension', 'celery'}); "
        "print(leaked); sys.exit(1 if leaked else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_submit_wait_download_and_load(tide, finished_job, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = tide.download(finished_job["id"], tmp_path, progress=False)
    manifest = tide.manifest(finished_job["id"])
    assert result.resumed_from == 0 and result.received == result.size == manifest["archive"]["size"]
    assert result.sha256 == manifest["archive"]["sha256"]
    assert result.folder == tmp_path / finished_job["id"]
    assert not (tmp_path / f"{finished_job['id']}.tar.partial").exists()
    tokenizer = AutoTokenizer.from_pretrained(result.folder)
    model = AutoModelForCausalLM.from_pretrained(result.folder)
    assert model.get_input_embeddings().weight.shape[0] % 64 == 0
    for term in TERMS:
        assert len(tokenizer.encode(" " + term, add_special_tokens=False)) == 1, term
    # a second call finds the finished archive and fetches nothing
    again = tide.download(finished_job["id"], tmp_path, progress=False)
    assert again.received == 0 and again.folder == result.folder


def test_an_interrupted_download_resumes_where_it_stopped(tide, finished_job, tmp_path):
    job_id = finished_job["id"]
    size = tide.manifest(job_id)["archive"]["size"]
    assert size > 4 * 65536, "the archive must span several chunks for this test to mean anything"
    stop_at = size // 3

    def interrupt(written: int) -> None:
        if written >= stop_at:
            raise KeyboardInterrupt  # what Ctrl-C does in the middle of a download

    with pytest.raises(KeyboardInterrupt):
        tide.download(job_id, tmp_path, progress=False, on_bytes=interrupt)
    partial = tmp_path / f"{job_id}.tar.partial"
    kept = partial.stat().st_size
    assert stop_at <= kept < size
    assert not (tmp_path / f"{job_id}.tar").exists()

    result = tide.download(job_id, tmp_path, progress=False)
    assert result.resumed_from == kept and result.received == size - kept
    assert (tmp_path / f"{job_id}.tar").stat().st_size == size and not partial.exists()
    assert (result.folder / "config.json").is_file()


def test_a_corrupted_download_is_caught_by_its_sha256(tide, finished_job, tmp_path):
    from app.client import ChecksumError

    job_id = finished_job["id"]
    size = tide.manifest(job_id)["archive"]["size"]

    def interrupt(written: int) -> None:
        if written >= size // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tide.download(job_id, tmp_path, progress=False, on_bytes=interrupt)
    partial = tmp_path / f"{job_id}.tar.partial"
    with partial.open("r+b") as handle:  # one flipped byte in what is already on disk
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ChecksumError) as caught:
        tide.download(job_id, tmp_path, progress=False)
    assert caught.value.expected == tide.manifest(job_id)["archive"]["sha256"] != caught.value.actual
    assert "run the download again" in caught.value.message
    assert not partial.exists() and not (tmp_path / f"{job_id}.tar").exists() and not (tmp_path / job_id).exists()
    fresh = tide.download(job_id, tmp_path, progress=False)  # and the retry starts afresh
    assert fresh.resumed_from == 0 and fresh.received == size


def test_cancel_through_the_client(tide, finished_job):
    from app.client import ClientError

    job = tide.submit(TINY_MODEL, terms=["hypertext"], options={"training": {"steps": 100_000, "batch_size": 2, "seq_len": 64}, "evaluation": {"max_bytes": 4000}})
    answer = tide.cancel(job["id"])
    assert answer["status"] in ("cancelled", "cancelling")
    assert tide.wait(job["id"], progress=False, poll_s=0.3, timeout=120)["status"] == "cancelled"
    # the server's error arrives as a ClientError with its code, status and param
    with pytest.raises(ClientError) as caught:
        tide.cancel(finished_job["id"])
    assert caught.value.param == "job_id" and caught.value.code == "job_finished" and caught.value.status == 409


def _tide(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).with_name("tide")), "jobs", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )


def test_tide_jobs_command_line(live_server, api_key, tmp_path):
    env = {**os.environ, "TIDE_URL": live_server, "TIDE_API_KEY": api_key, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    terms = tmp_path / "terms.txt"
    terms.write_text("\ufeffhypertext\n\n  microprocessor  \n", encoding="utf-8")

    # the server's own validation error, naming the option, exit code 2, no job
    bad = _tide(["submit", "--base-model", TINY_MODEL, "--terms", str(terms), "--set", "training.batch_size=0"], env, tmp_path)
    assert bad.returncode == 2 and "(training.batch_size)" in bad.stderr, bad.stderr
    no_key = _tide(["list"], {k: v for k, v in env.items() if k != "TIDE_API_KEY"}, tmp_path)
    assert no_key.returncode == 2 and "TIDE_API_KEY" in no_key.stderr

    examples = tmp_path / "examples.txt"  # a few documents of the user's text: the job judges on one of them
    examples.write_text("A hypertext links documents.\n\nEvery microprocessor runs hypertext browsers.\n\n"
                        "The microprocessor reads hypertext.\n", encoding="utf-8")
    submitted = _tide([
        "submit", "--base-model", TINY_MODEL, "--terms", str(terms), "--examples", str(examples), "--wait",
        "--set", "training.steps=3", "--set", "training.batch_size=2", "--set", "training.seq_len=64",
        "--set", "training.warmup_steps=0", "--set", "evaluation.max_bytes=4000",
    ], env, tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.startswith("job_") and "3/3" in submitted.stderr and "succeeded" in submitted.stderr

    shown = json.loads(_tide(["show", job_id], env, tmp_path).stdout)
    assert len(shown["request"]["examples"]) == 3
    assert shown["metrics"]["selection"]["judging"]["source"] == "held-out documents of your examples, judging part"
    events = _tide(["events", job_id], env, tmp_path)
    assert events.returncode == 0 and '"stage": "publish"' in events.stdout
    listed = _tide(["list", "--status", "succeeded"], env, tmp_path)
    assert job_id in listed.stdout

    downloaded = _tide(["download", job_id, "--out", str(tmp_path / "models")], env, tmp_path)
    assert downloaded.returncode == 0, downloaded.stderr
    folder = Path(downloaded.stdout.strip())
    assert folder == tmp_path / "models" / job_id and (folder / "model.safetensors").is_file()
    assert "matches the manifest" in downloaded.stderr

    assert _tide(["delete", job_id], env, tmp_path).returncode == 0
    gone = _tide(["show", job_id], env, tmp_path)
    assert gone.returncode == 2 and "no job" in gone.stderr
