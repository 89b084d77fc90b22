"""A Trainer checkpoint as a job's base model, through the real API and worker: the published
model is itself a resumable checkpoint (optimizer.pt grown, scheduler / trainer state / RNG
carried), listed in the manifest like every other file, and a real Trainer resumes from the
downloaded folder; a sharded one is refused with the reason."""

from __future__ import annotations

import io
import json
import shutil
import tarfile

import pytest

from .conftest import TINY_MODEL, foldoc_documents, wait_for_status

pytestmark = pytest.mark.slow


def _rows(tokenizer) -> list[dict]:
    texts = [tokenizer(doc[:200])["input_ids"] for doc in foldoc_documents(16)]
    return [{"input_ids": ids, "labels": ids} for ids in texts]


def _args(folder, *, max_steps: int, save_steps: int = 0):
    from transformers import TrainingArguments

    return TrainingArguments(str(folder), max_steps=max_steps, save_steps=save_steps or max_steps, save_strategy="steps" if save_steps else "no",
                             per_device_train_batch_size=1, report_to=[], use_cpu=True, logging_steps=1000, learning_rate=1e-3)


@pytest.fixture(scope="module")
def checkpoint_name(service_settings) -> str:
    """The tiny model trained 2 Trainer steps, saved as a checkpoint under the models directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer

    source = service_settings.models_dir / TINY_MODEL
    model, tokenizer = AutoModelForCausalLM.from_pretrained(source).train(), AutoTokenizer.from_pretrained(source)
    tokenizer.pad_token = tokenizer.eos_token  # the default collator pads, even single rows
    run = service_settings.data_dir / "user-run"
    Trainer(model=model, args=_args(run, max_steps=2, save_steps=2), train_dataset=_rows(tokenizer), processing_class=tokenizer).train()
    shutil.copytree(run / "checkpoint-2", service_settings.models_dir / "user-run-step-2")
    return "user-run-step-2"


def test_job_on_a_trainer_checkpoint_publishes_a_checkpoint_a_trainer_resumes(client, auth, worker, checkpoint_name, tmp_path):
    # selection "none": the last step is published, so the new rows carry their own AdamW moments
    # (a step-0 best on the tiny model would publish the init rows, which have none)
    body = {"base_model": checkpoint_name, "terms": ["multiprogramming", "hypertext"], "selection": "none",
            "training": {"steps": 2, "batch_size": 2, "seq_len": 32, "warmup_steps": 0}, "evaluation": {"max_bytes": 2000}}
    response = client.post("/extend", json=body, headers=auth)
    assert response.status_code == 202, response.text
    job = wait_for_status(client, auth, response.json()["id"], {"succeeded", "failed"}, timeout=300, worker=worker)
    assert job["status"] == "succeeded", job
    manifest = client.get(job["artifacts"]["manifest_url"], headers=auth).json()
    paths = {f["path"] for f in manifest["files"]}
    assert {"optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth", "model.safetensors"} <= paths
    url = next(f["url"] for f in manifest["files"] if f["path"] == "tide_extension.json")
    carried = json.loads(client.get(url, headers=auth).content)["trainer_checkpoint"]
    assert carried["from_step"] == 2 and carried["new_rows_from"] == "adapter"

    # Downloaded as a user would, then resumed by a real Trainer for two more steps.
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer

    archive = client.get(manifest["archive"]["url"], headers=auth)
    assert archive.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        tar.extractall(tmp_path, filter="data")
    published = tmp_path / job["id"]
    model, tokenizer = AutoModelForCausalLM.from_pretrained(published), AutoTokenizer.from_pretrained(published)
    tokenizer.pad_token = tokenizer.eos_token
    trainer = Trainer(model=model, args=_args(tmp_path / "resumed", max_steps=4), train_dataset=_rows(tokenizer),
                      processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=str(published))
    assert trainer.state.global_step == 4
    steps = {int(state["step"]) for state in trainer.optimizer.state_dict()["state"].values()}
    assert steps == {4}  # the carried moments were loaded and continued, not started again


def test_a_sharded_checkpoint_is_refused_with_the_reason(client, auth, worker, service_settings, checkpoint_name):
    sharded = service_settings.models_dir / "user-run-zero"
    shutil.copytree(service_settings.models_dir / checkpoint_name, sharded)
    (sharded / "zero_to_fp32.py").write_text("# DeepSpeed's consolidation script\n")
    body = {"base_model": "user-run-zero", "terms": ["hypertext"], "training": {"steps": 1, "batch_size": 1, "seq_len": 16}}
    response = client.post("/extend", json=body, headers=auth)
    assert response.status_code == 202, response.text
    job = wait_for_status(client, auth, response.json()["id"], {"succeeded", "failed"}, timeout=120, worker=worker)
    assert job["status"] == "failed" and job["error"]["code"] == "unsupported_checkpoint"
    assert job["error"]["param"] == "base_model" and "DeepSpeed ZeRO" in job["error"]["message"]
    assert job["artifacts"] is None
