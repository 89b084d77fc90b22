"""One device per job (extension/plan/devices.py): the `--device` / `--device-map` options through the
CLI door, what metrics.json records for every stage, the load that goes straight to the device,
publishing in the checkpoint's dtype when the job computed in another one, and a model spread
with accelerate's device map (here: one layer offloaded to disk, the only split a CPU-only
machine can make)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from app.cli import main
from extension.plan import devices
from extension.plan.devices import Placement, resolve_placement
from extension.errors import InvalidOptionError
from tests.service.conftest import foldoc_documents

TERMS = ["compiler", "interrupt"]
# A stage that did not run is not recorded; these are the stages of each kind of job.
TERMS_JOB_STAGES = {"load", "extend", "init", "generate", "train", "select", "evaluate", "padding_calibration", "publish"}
CORPUS_JOB_STAGES = {"load", "mine", "init", "generate", "train", "select", "evaluate", "padding_calibration", "publish"}
# tiny_model_dir's modules, one layer on disk: accelerate's offload, brought in per forward
SPLIT = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
         "model.norm": "cpu", "lm_head": "cpu"}
# These check what a machine WITHOUT CUDA does (auto picks the CPU, cuda is refused with its fix).
ON_A_MACHINE_WITHOUT_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def _extend(tmp_path, model_dir, out: str, *extra: str, terms=TERMS, corpus: Path | None = None) -> int:
    argv = ["extend", "--base-model", str(model_dir), "--out", str(tmp_path / out), "--steps", "2", "--batch-size", "2",
            "--seq-len", "32", "--eval-bytes", "1000", "--warmup-steps", "0", *extra]
    if terms:
        terms_file = tmp_path / f"{out}.txt"
        terms_file.write_text("\n".join(terms) + "\n")
        argv += ["--terms", str(terms_file)]
    if corpus is not None:
        argv += ["--corpus", str(corpus), "--max-new-tokens", "12"]
    return main(argv)


def _metrics(out_dir: Path) -> dict:
    return json.loads((out_dir / "metrics.json").read_text())


def test_extend_device_cpu_records_cpu_for_every_stage(tmp_path, tiny_model_dir, cli_cache):
    # precision 'checkpoint': the checkpoint's fp32 whatever this CPU does in bf16
    assert _extend(tmp_path, tiny_model_dir, "terms", "--device", "cpu", "--precision", "checkpoint") == 0
    recorded = _metrics(tmp_path / "terms")["devices"]
    assert set(recorded) == TERMS_JOB_STAGES
    assert {stage: info["device"] for stage, info in recorded.items()} == {stage: "cpu" for stage in TERMS_JOB_STAGES}
    assert recorded["train"] == {"device": "cpu", "dtype": "float32", "rows_dtype": "float32"}
    assert all(info["dtype"] == "float32" for stage, info in recorded.items() if stage != "extend")

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(foldoc_documents(300, skip=50)))
    # a random tiny model's mined tokens cannot be relied on to pay: every term is kept, devices are the point
    assert _extend(tmp_path, tiny_model_dir, "corpus", "--device", "cpu", "--precision", "checkpoint", "--keep-all-terms",
                   terms=None, corpus=corpus) == 0
    recorded = _metrics(tmp_path / "corpus")["devices"]
    assert set(recorded) == CORPUS_JOB_STAGES
    assert all(info["device"] == "cpu" for info in recorded.values())


@ON_A_MACHINE_WITHOUT_CUDA
def test_the_default_device_on_a_machine_without_a_gpu_is_cpu(tmp_path, tiny_model_dir, cli_cache):
    assert resolve_placement("auto", "none") == Placement(torch.device("cpu"))
    assert _extend(tmp_path, tiny_model_dir, "auto", "--steps", "0") == 0
    assert {info["device"] for info in _metrics(tmp_path / "auto")["devices"].values()} == {"cpu"}


def test_a_job_that_leaves_steps_unset_trains_its_devices_default(tmp_path, tiny_model_dir, cli_cache):
    """`--steps` left out: 150 on a CPU, 400 on a GPU (extension/plan/options.py), filled in where the
    job runs and recorded with the device that chose it."""
    from extension.plan.options import BY_NAME

    terms = tmp_path / "terms.txt"
    terms.write_text("\n".join(TERMS) + "\n")
    # with examples: a terms-only job without them trains only where it writes 100 contexts per term
    examples = tmp_path / "examples.txt"
    examples.write_text("\n\n".join(f"A note on {term} and how {term} is used." for term in TERMS))
    assert main(["extend", "--base-model", str(tiny_model_dir), "--terms", str(terms), "--examples", str(examples),
                 "--out", str(tmp_path / "out"), "--batch-size", "2", "--seq-len", "32", "--eval-bytes", "1000",
                 "--checkpoint-every", "0"]) == 0
    extension = json.loads((tmp_path / "out" / "tide_extension.json").read_text())
    device = extension["device_defaults"]["device"]
    assert device == ("cuda" if torch.cuda.is_available() else "cpu_bf16" if devices.cpu_computes_bf16() else "cpu")
    steps = BY_NAME["steps"].default_on(device)
    assert extension["device_defaults"]["options"] == {
        "steps": steps, "max_train_seconds": BY_NAME["max_train_seconds"].default_on(device),
        "term_contexts": BY_NAME["term_contexts"].default_on(device), "term_context_tokens": BY_NAME["term_context_tokens"].default_on(device)}
    assert extension["spec"]["steps"] == extension["trained_steps"] == _metrics(tmp_path / "out")["training"]["steps"] == steps


@pytest.mark.parametrize(
    "flag, value, needle",
    [
        ("--device", "tpu", "--device must be auto, cpu, cuda or cuda:N (N the number of a GPU), got 'tpu'"),
        ("--device", "cuda:x", "--device must be auto, cpu, cuda or cuda:N"),
        ("--device-map", "everywhere", "--device-map must be none, auto, balanced, balanced_low_0, sequential or a JSON object"),
        ("--device-map", '{"model.layers.0": "gpu"}', "--device-map has entries that are not module: device"),
        ("--device-map", "{not json", "--device-map is not valid JSON"),
    ],
)
def test_a_bad_device_value_names_the_flag_and_writes_nothing(tmp_path, tiny_model_dir, cli_cache, capsys, flag, value, needle):
    assert _extend(tmp_path, tiny_model_dir, "out", flag, value) == 2
    err = capsys.readouterr().err
    assert f"error ({flag}): {needle}" in err
    assert not (tmp_path / "out").exists()


@ON_A_MACHINE_WITHOUT_CUDA
def test_cuda_on_a_machine_without_cuda_says_so_and_the_fix(tmp_path, tiny_model_dir, cli_cache, capsys):
    for value in ("cuda", "cuda:1"):
        assert _extend(tmp_path, tiny_model_dir, "out", "--device", value) == 2
        err = capsys.readouterr().err
        assert f"error (--device): --device is {value!r} but this machine has no CUDA GPU" in err
        assert "use auto or cpu" in err
    assert not (tmp_path / "out").exists()


def test_cuda_device_numbers_are_checked_against_the_visible_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_placement("auto").device == torch.device("cuda:0")  # the worker's first (assigned) GPU
    assert resolve_placement("cuda").device == torch.device("cuda:0")
    assert resolve_placement("cuda:1").device == torch.device("cuda:1")
    with pytest.raises(InvalidOptionError) as caught:
        resolve_placement("cuda:2")
    assert caught.value.option == "device"
    assert caught.value.problem == "is 'cuda:2' but only 2 CUDA GPUs are visible here (cuda:0 to cuda:1); use one of those, or auto"


def test_a_gpu_job_loads_straight_onto_the_gpu_in_bf16(monkeypatch):
    """What from_pretrained is asked for: the device as the device map and bf16 (on a GPU with
    bf16), so the weights never sit on the CPU in fp32 first. A CPU without bf16 in hardware, or
    precision 'checkpoint', keeps the checkpoint's dtype."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    gpu = Placement(torch.device("cuda:1"))
    assert gpu.load_kwargs(torch.float32) == {"dtype": torch.bfloat16, "device_map": {"": "cuda:1"}}
    assert Placement(torch.device("cuda:1"), precision="checkpoint").load_kwargs(torch.float32) == {
        "dtype": torch.float32, "device_map": {"": "cuda:1"}}
    monkeypatch.setattr(devices, "cpu_computes_bf16", lambda: False)
    assert Placement(torch.device("cpu")).load_kwargs(torch.float32) == {"dtype": "auto"}
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert gpu.load_kwargs(torch.float16) == {"dtype": torch.float16, "device_map": {"": "cuda:1"}}
    spread = Placement(torch.device("cuda:0"), "auto")
    assert spread.load_kwargs(torch.bfloat16, offload_folder="/w/offload") == {
        "dtype": torch.bfloat16, "device_map": "auto", "offload_folder": "/w/offload"}


def _assert_old_rows_are_the_source_files(out_dir: Path, model_dir: Path) -> dict:
    source = load_file(str(model_dir / "model.safetensors"))
    published = load_file(str(out_dir / "model.safetensors"))
    for name, tensor in source.items():
        if name == "model.embed_tokens.weight":
            assert published[name].dtype == tensor.dtype
            assert torch.equal(published[name][: tensor.shape[0]], tensor), "old rows must be bit-identical"
        else:
            assert torch.equal(published[name], tensor), name
    return published


def test_a_job_computing_in_bf16_publishes_the_checkpoints_fp32_with_old_rows_bit_identical(
    tmp_path, tiny_model_dir, cli_cache, monkeypatch
):
    """The GPU recipe on the CPU: the job's model is loaded in bf16 (as on a GPU with bf16), the
    rows train in fp32 on it, and the published checkpoint is the fp32 source with the rows
    written in, not the bf16 model."""
    monkeypatch.setattr(devices.Placement, "compute_dtype", lambda self, checkpoint: torch.bfloat16)
    assert _extend(tmp_path, tiny_model_dir, "bf16", "--device", "cpu") == 0
    metrics = _metrics(tmp_path / "bf16")
    assert metrics["devices"]["train"] == {"device": "cpu", "dtype": "bfloat16", "rows_dtype": "float32"}
    assert metrics["devices"]["evaluate"]["dtype"] == "bfloat16"
    assert metrics["devices"]["publish"] == {"device": "cpu", "dtype": "float32"}
    assert metrics["after"]["settings"]["dtype"] == "bfloat16"
    published = _assert_old_rows_are_the_source_files(tmp_path / "bf16", tiny_model_dir)
    base = load_file(str(tiny_model_dir / "model.safetensors"))["model.embed_tokens.weight"].shape[0]
    extension = json.loads((tmp_path / "bf16" / "tide_extension.json").read_text())
    new = published["model.embed_tokens.weight"][base : base + extension["counts"]["new_vocab_entries"]]
    assert new.dtype == torch.float32 and torch.isfinite(new).all() and new.abs().sum() > 0


def test_a_model_spread_with_a_device_map_trains_evaluates_and_publishes_the_same(tmp_path, tiny_model_dir, cli_cache):
    """accelerate's offload as the split a CPU-only machine can make: layer 1 lives on disk and is
    brought in for each forward (and kept for the backward). The job gives the same rows and the
    same numbers as the job with the whole model in memory, and publishes the source weights."""
    exact = ("--precision", "checkpoint")  # the split's dtype checked below is the checkpoint's
    assert _extend(tmp_path, tiny_model_dir, "whole", "--device", "cpu", *exact) == 0
    assert _extend(tmp_path, tiny_model_dir, "split", "--device", "cpu", "--device-map", json.dumps(SPLIT), *exact) == 0
    whole, split = _metrics(tmp_path / "whole"), _metrics(tmp_path / "split")
    assert split["devices"]["load"] == {"device": "cpu+disk", "dtype": "float32", "main": "cpu"}
    assert split["devices"]["train"]["device"] == "cpu+disk"
    assert split["devices"]["publish"] == {"device": "cpu", "dtype": "float32"}  # the checkpoint again, nothing offloaded
    assert [h["loss"] for h in split["training"]["history"]] == [h["loss"] for h in whole["training"]["history"]]
    assert split["comparison"] == whole["comparison"]
    published = _assert_old_rows_are_the_source_files(tmp_path / "split", tiny_model_dir)
    reference = load_file(str(tmp_path / "whole" / "model.safetensors"))
    assert all(torch.equal(published[name], reference[name]) for name in reference)


def test_a_device_map_that_offloads_the_embedding_is_refused(tmp_path, tiny_model_dir, cli_cache, capsys):
    split = {**SPLIT, "model.embed_tokens": "disk"}
    assert _extend(tmp_path, tiny_model_dir, "out", "--device", "cpu", "--device-map", json.dumps(split)) == 2
    err = capsys.readouterr().err
    assert "error (--device-map): --device-map offloads the model's input embedding (model.embed_tokens: disk;" in err
    assert "map it to a GPU, or to cpu when no GPU is used" in err
    assert not (tmp_path / "out").exists()


def test_the_service_setting_is_checked_when_the_settings_load(monkeypatch):
    from pydantic import ValidationError

    from app.settings import Settings

    assert Settings().device == "auto" and Settings().device_map == "none"
    monkeypatch.setenv("TIDE_DEVICE", "gpu0")
    with pytest.raises(ValidationError, match=r"TIDE_DEVICE must be auto, cpu, cuda or cuda:N"):
        Settings()
    monkeypatch.setenv("TIDE_DEVICE", "cuda:0")
    monkeypatch.setenv("TIDE_DEVICE_MAP", "[1, 2]")
    with pytest.raises(ValidationError, match=r"TIDE_DEVICE_MAP must be none, auto"):
        Settings()
    monkeypatch.setenv("TIDE_DEVICE_MAP", "balanced")
    assert (Settings().device, Settings().device_map) == ("cuda:0", "balanced")
    assert Settings().precision == "auto"
    monkeypatch.setenv("TIDE_PRECISION", "fp32")
    with pytest.raises(ValidationError, match=r"TIDE_PRECISION must be one of 'auto', 'checkpoint', got 'fp32'"):
        Settings()
    monkeypatch.setenv("TIDE_PRECISION", "checkpoint")
    assert Settings().precision == "checkpoint"


def test_the_worker_passes_the_device_settings_to_the_job():
    from types import SimpleNamespace

    from app.settings import Settings
    from worker.runner import build_spec

    job = SimpleNamespace(id="j", request={"base_model": "m", "terms": ["kernel"]})
    spec = build_spec(job, None, Settings(device="cpu", device_map='{"": "cpu"}', data_dir=Path(os.devnull).parent))
    assert (spec.device, spec.device_map) == ("cpu", '{"": "cpu"}')


def _service_job(settings, request: dict) -> str:
    from app.db import jobs as job_state
    from app.db.keys import create_key
    from app.db.models import Job
    from worker.runner import sessions_for

    with sessions_for(settings)() as db:
        key, _ = create_key(db, "k")
        job = Job(id=job_state.new_job_id(), owner_id=key.id, request_hash="h", base_model=request["base_model"], request=request)
        db.add(job)
        db.commit()
        return job.id


def _service_job_row(settings, job_id: str):
    from app.db.models import Job
    from worker.runner import sessions_for

    with sessions_for(settings)() as db:
        job = db.query(Job).filter_by(id=job_id).one()
        db.expunge(job)
        return job


def test_a_service_job_with_tide_device_cpu_records_cpu_for_every_stage(tmp_path, tiny_model_dir):
    """The service's door: the worker's TIDE_DEVICE setting (not a request field) decides, and the
    job's stored metrics say every stage ran on the CPU."""
    from app.settings import Settings
    from worker.runner import execute

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(tiny_model_dir, target_is_directory=True)
    settings = Settings(data_dir=tmp_path, cache_dir=tmp_path / "cache", device="cpu")
    job_id = _service_job(settings, {"base_model": "tiny", "terms": TERMS, "training": {"steps": 2, "batch_size": 2, "seq_len": 32},
                                     "evaluation": {"max_bytes": 1000}})
    assert execute(job_id, settings) == "succeeded"
    job = _service_job_row(settings, job_id)
    assert set(job.metrics["devices"]) == TERMS_JOB_STAGES
    assert {info["device"] for info in job.metrics["devices"].values()} == {"cpu"}


@ON_A_MACHINE_WITHOUT_CUDA
def test_a_service_job_on_a_worker_set_to_cuda_without_cuda_fails_naming_the_setting(tmp_path):
    """The service's door: the device is the operator's TIDE_DEVICE, not a request field, so a
    worker that cannot honour it fails the job with invalid_option naming the setting and the fix
    (the request itself was fine)."""
    from app.settings import Settings
    from worker.runner import execute

    settings = Settings(data_dir=tmp_path, device="cuda")
    job_id = _service_job(settings, {"base_model": "m", "terms": ["kernel"]})
    assert execute(job_id, settings) == "failed"
    job = _service_job_row(settings, job_id)
    code, message = job.error_code, job.error_message
    assert job.status == "failed"
    assert code == "invalid_option"
    assert message.startswith("the server setting TIDE_DEVICE is 'cuda' but this machine has no CUDA GPU")
    assert "use auto or cpu" in message


def test_batches_are_sized_for_the_device(monkeypatch):
    """The CPU keeps evaluation's 4096 tokens and generation's 16 prompts (its numbers and timings
    stay as they were); a GPU's evaluation batch grows with its free memory, within bounds."""
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, vocab_size=49152)
    cpu, gpu = torch.device("cpu"), torch.device("cuda:0")
    assert devices.eval_batch_tokens_for(cpu, config, torch.float32) == 4096
    low, high = devices.GPU_EVAL_BATCH_TOKENS
    monkeypatch.setattr(devices, "free_device_memory", lambda device: 100 * 2**30)
    assert devices.eval_batch_tokens_for(gpu, config, torch.bfloat16) == high
    monkeypatch.setattr(devices, "free_device_memory", lambda device: 2 * 2**30)
    per_token = (6 * 576 + 3 * 1536) * 2
    assert devices.eval_batch_tokens_for(gpu, config, torch.bfloat16) == (2 * 2**30 // 4 // per_token) // 1024 * 1024
    monkeypatch.setattr(devices, "free_device_memory", lambda device: 2**20)
    assert devices.eval_batch_tokens_for(gpu, config, torch.bfloat16) == low
    model = torch.nn.Module()
    model.get_input_embeddings = lambda: torch.nn.Embedding(4, 2)
    assert devices.generation_batch_size(model) == devices.CPU_GENERATION_BATCH == 64  # no config: the default
    model.config = config  # 135M-sized: 13 MB of cache per 96-token sequence in fp32
    assert devices.generation_batch_size(model) == 64
    model.config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                               num_key_value_heads=8)  # Llama 3 8B on a CPU: 25 MB per sequence in fp32
    assert devices.generation_batch_size(model) == 2**30 // (2 * 32 * 1024 * 96 * 4) == 42


def test_checking_the_device_settings_does_not_import_torch():
    """The API reads the same settings; it must not pay for torch to check two strings."""
    import subprocess
    import sys

    code = ("import sys; from app.settings import Settings; Settings(device='cuda:1', device_map='auto'); "
            "import app.main; assert 'torch' not in sys.modules, 'torch was imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_cpu_that_computes_bf16_in_hardware_runs_jobs_in_bf16_and_takes_its_own_steps_default(monkeypatch):
    """precision 'auto' on an AMX / AVX-512 BF16 CPU: the job computes in bf16 (its steps cost
    about 0.57x an fp32 step's) and takes the steps default of such a CPU; 'checkpoint' keeps
    the checkpoint's dtype and the plain CPU default."""
    from extension.plan.options import BY_NAME, defaults_for_device
    from extension.plan.spec import ExtendSpec

    monkeypatch.setattr(devices, "cpu_computes_bf16", lambda: True)
    fast = resolve_placement("cpu")
    assert (fast.defaults_kind, fast.compute_dtype(torch.float32)) == ("cpu_bf16", torch.bfloat16)
    assert fast.load_kwargs(torch.float32) == {"dtype": torch.bfloat16}
    exact = resolve_placement("cpu", precision="checkpoint")
    assert (exact.defaults_kind, exact.compute_dtype(torch.float32)) == ("cpu", torch.float32)
    spec = ExtendSpec(base_model="smollm2-135m", out_dir="/tmp/x", terms=["a"])
    assert defaults_for_device(spec, fast.defaults_kind)["steps"] == BY_NAME["steps"].default_on("cpu_bf16")
    assert defaults_for_device(spec, exact.defaults_kind)["steps"] == BY_NAME["steps"].default == 150
    assert BY_NAME["steps"].default_on("cpu_bf16") > 150
    monkeypatch.setattr(devices, "cpu_computes_bf16", lambda: False)
    assert resolve_placement("cpu").defaults_kind == "cpu"
    assert resolve_placement("cpu").compute_dtype(torch.float32) == torch.float32


def test_precision_is_checked_and_named_by_its_flag(tmp_path, tiny_model_dir, cli_cache, capsys):
    assert _extend(tmp_path, tiny_model_dir, "out", "--precision", "fp8") == 2
    assert "error (--precision): --precision must be one of 'auto', 'checkpoint', got 'fp8'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
