"""Does `tide extend` work on the model families users bring? (issue 23, "Prove"; issue 40's layouts)

Runs every case of tests/model_families.py — real tokenizers of Llama 3 (GGUF conversion and the
original layout with `ignore_merges`), Qwen 2 (both layouts, the original with an embedding
padded past its tokenizer), Llama 2 / Mistral, Phi-3, DeepSeek LLM and Coder, Falcon, GPT-2,
GPT-NeoX and the two built-ins; tiny random models of Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma 3,
Qwen3-MoE, Mixtral, GPT-2, Granite, Cohere, BLOOM, OPT (projected embedding), Mamba, Gemma 3n's
text model (per-layer table), and the multimodal Gemma 3, Qwen2-VL and LLaVA; tied and untied, fp32
and bf16, one file and sharded, a base padded to a multiple of 128, new terms on reserved ids
(Gemma 3 and Llama 3 tokenizers) — through `tide extend`, checks each published folder
(tests/published_checks.check_published) and converts it with llama.cpp's own
`convert_hf_to_gguf.py` (from the llama-cpp-python sdist), reading the GGUF back to find every new
token at its id.

    .venv/bin/python benchmarks/model_families.py [--cases SUBSTRING ...] [--out benchmarks/results/model_families.md]

Writes the .md table and a .json beside it. Seconds are wall time of the `tide extend` call alone
(in one process, imports paid before the first case), on whatever else the machine was doing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.model_families import (  # noqa: E402
    CASES, FAMILIES, NEEDS_VISION_LIBS, SDIST, TERMS, base_checkpoint, check_published, corpus_text, extend_args,
    llama_cpp_dir,
    tokenizer_ids_end, work_folder,
)
from tests.published_checks import CHECKS  # noqa: E402
RESULTS = REPO / "benchmarks" / "results" / "model_families.md"


def convert_to_gguf(published: Path, outfile: Path) -> dict:
    """llama.cpp's converter on a published folder: did it convert, which pre-tokenizer did it
    record, and is every new token at its id in the GGUF's vocabulary?"""
    root = llama_cpp_dir()
    env = {"PYTHONPATH": f"{root / 'gguf-py'}:{root}", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": "/tmp"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(root / "convert_hf_to_gguf.py"), str(published), "--outfile", str(outfile),
                           "--outtype", "f32"], env=env, capture_output=True, text=True)
    seconds = round(time.perf_counter() - started, 1)
    if proc.returncode != 0:
        last = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()][-1:]
        return {"converted": False, "seconds": seconds, "error": (last[0] if last else "")[:300]}
    sys.path.insert(0, str(root / "gguf-py"))
    from gguf import GGUFReader

    reader = GGUFReader(outfile)

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]

    pre = strings("tokenizer.ggml.pre")[0] if "tokenizer.ggml.pre" in reader.fields else None
    converted = {"converted": True, "seconds": seconds, "pre_tokenizer": pre, "model": strings("tokenizer.ggml.model")[0]}
    if (published / "tide_extension.json").exists():  # an extended folder, not a base
        tokens = strings("tokenizer.ggml.tokens")
        extension = json.loads((published / "tide_extension.json").read_text())
        at_id = sum(1 for t in extension["new_tokens"] if t["id"] < len(tokens) and tokens[t["id"]] in (t["token"], t["text"]))
        converted["new_tokens_at_their_ids"] = f"{at_id}/{len(extension['new_tokens'])}"
    return converted


def run_case(case, folder: Path, terms_file: Path, corpus_file: Path, model_sources) -> dict:
    from transformers import AutoTokenizer

    from app.cli import main

    base = base_checkpoint(case, model_sources)
    config = json.loads((base / "config.json").read_text())
    base_rows = config.get("text_config", {}).get("vocab_size") or config["vocab_size"]
    out = folder / case.id
    started = time.perf_counter()
    code = main(extend_args(case, base, out, terms_file, corpus_file))
    seconds = round(time.perf_counter() - started, 1)
    row = {"case": case.id, "family": case.family, "architecture": case.architecture, "tied": case.tied,
           "dtype": case.dtype, "sharded": case.sharded, "trained": case.train, "new_ids_asked": case.new_ids or "auto",
           "exit_code": code, "seconds": seconds,
           # rows past every id the base's tokenizer uses, however the case made them (multimodal builders pad their own)
           "padded_rows": base_rows - tokenizer_ids_end(AutoTokenizer.from_pretrained(base))}
    if code != 0:
        return row
    extension = json.loads((out / "tide_extension.json").read_text())
    row["checks"] = check_published(case, base, out, work_folder(out))
    row["vocab"] = extension["vocab"]
    row["new_token_ids"] = [t["id"] for t in extension["new_tokens"]]
    row["reserved_tokens"] = extension.get("reserved_tokens")
    row["terms"] = {t["term"]: t["mechanism"] for t in extension["terms"]}
    row["skipped"] = {s["term"]: s["detail"] for s in extension["skipped"]}
    row["gguf"] = convert_to_gguf(out, folder / f"{case.id}.gguf")
    # A refusal counts against TIDE only where llama.cpp converts the base it started from.
    row["base_gguf"] = convert_to_gguf(base, folder / f"{case.id}-base.gguf")
    return row


def mark(value: str | None) -> str:
    """A check's cell; None: not run (the published folder did not load)."""
    return "-" if value is None else "pass" if value == "" else ("n/a" if value == "n/a" else "FAIL")


def gguf_cell(gguf: dict) -> str:
    return f"pre `{gguf['pre_tokenizer']}`" if gguf["converted"] else "refused"


def first_new_id(row: dict) -> int:
    """The lowest id a new token took: a reserved token's on reserved ids, else the base vocabulary's end."""
    return min(row["new_token_ids"]) if row.get("new_token_ids") else row["vocab"]["base_vocab_size"]


def report(payload: dict) -> str:
    lines = [
        "# Model families through `tide extend`",
        "",
        f"Command: `{payload['command']}`",
        "",
        f"Tokenizers: llama.cpp's vocab-only GGUF test files from `{SDIST}`, converted by transformers; "
        "`-original` = the family's own layout (special tokens only as added tokens after the BPE vocabulary; "
        "Llama 3 with `ignore_merges`); gpt-neox: its vocab file read by transformers' GGUF tokenizer builder. "
        "Weights: tiny random models (2 layers, hidden 32) of the named class; the multimodal ones with a one-layer "
        "vision tower and their processor (Qwen2-VL has none: its processor needs torchvision); Gemma3nForCausalLM with "
        "Gemma 3n's per-layer ratio (262,400 input rows, a per-layer table of 262,144, 4 values per layer), and "
        "Gemma3nForConditionalGeneration with that text model, timm's MobileNet V5 vision tower at 1/16 of its "
        "channels and a one-layer audio encoder (timm and PyPI's torchvision loaded from .cache/vision-libs by "
        "tests/vision_libs.py). "
        "'reserved ids': the new terms took the tokenizer's reserved unused tokens (`--new-ids reserved`, or on Gemma 3n "
        "chosen by the default 'auto'). "
        + "".join(f"Not run: {case} ({why}). " for case, why in payload.get("not_run", [])) +
        f"Terms: {', '.join(TERMS)}. `--steps 0`, or 2 steps on FOLDOC text (with a paragraph that uses every term) "
        "with every term kept where 'trained'.",
        "",
        "Checks (tests/published_checks.py): loads = the family's Auto class loads it as the base's class, and base + "
        "adapter load; processor = AutoProcessor loads it as the base's processor, every processor file carried over; "
        "config = every base setting kept but the vocabulary size; old_ids = no old token moved (but the reserved "
        "tokens the new ones replaced); old_rows = every vocab-indexed table's old rows (input, head, per-layer; but the "
        "taken reserved ids') bit-identical; other_weights = every other tensor (norms, projections, vision "
        "tower) bit-identical; one_token = each term's forms are one token; same_ids_on_plain_text = text without the "
        "new strings encodes as the base encodes it; decodes = text with the terms round-trips; forward_new_tokens = "
        "text with new tokens (after an image for multimodal) gives finite logits; old_logits = old ids' logits on plain "
        "text are the base's; adapter_logits = base + adapter predicts as the merged folder; fused_loss = the loss "
        "training computes (fused cross-entropy with the model's logit transform) equals the model's own loss on text "
        "with the new tokens; trained_rows = trained "
        "rows (input, head, per-layer) differ from the rows training started from; padding = rows a multiple of the "
        "base's 128, else of 64; reserved_ids = on reserved ids, the embedding and config keep their sizes and every "
        "new token sits on a reserved token's id that the config does not name; "
        "layout = dtypes, tying and sharding kept; llama_cpp_pre_tokenizer = llama.cpp still names the pre-tokenizer.",
        "",
        "| case | architecture | tied | dtype | shards | padded rows | " + " | ".join(CHECKS) + " | GGUF (llama.cpp): base | extended | first new id | s |",
        "| --- | --- | --- | --- | --- | ---: | " + " | ".join("---" for _ in CHECKS) + " | --- | --- | --- | ---: |",
    ]
    for row in payload["rows"]:
        on_reserved = (row.get("vocab") or {}).get("new_ids", row.get("new_ids_asked")) == "reserved"
        marks = ", ".join(([] if not row["trained"] else ["trained"]) + ([] if not on_reserved else ["reserved ids"]))
        head = (f"| {row['family']}{f' ({marks})' if marks else ''} | {row['architecture']} | "
                f"{'tied' if row['tied'] else 'untied'} | {row['dtype']} | {'3+' if row['sharded'] else '1'} | {row['padded_rows']} | ")
        if row["exit_code"] != 0:
            lines.append(head + " | ".join("-" for _ in CHECKS) + f" | - | exit {row['exit_code']} | - | {row['seconds']} |")
            continue
        base, extended = (gguf_cell(row[key]) for key in ("base_gguf", "gguf"))
        lines.append(head + " | ".join(mark(row["checks"].get(c)) for c in CHECKS)
                     + f" | {base} | {extended} | {first_new_id(row):,} | {row['seconds']} |")
    failures = [(row["case"], check, why) for row in payload["rows"] if row["exit_code"] == 0
                for check, why in row["checks"].items() if why not in ("", "n/a")]
    lines += ["", f"Cases: {len(payload['rows'])}; failed checks: {len(failures)}."]
    lines += [f"- {case}: {check}: {why}" for case, check, why in failures]
    converted = [row for row in payload["rows"] if row["exit_code"] == 0 and row["gguf"]["converted"]]
    base_converted = [row for row in payload["rows"] if row["exit_code"] == 0 and row["base_gguf"]["converted"]]
    lost = [row["case"] for row in base_converted if not row["gguf"]["converted"]]
    refused = [row["case"] for row in payload["rows"] if row["exit_code"] == 0 and not row["gguf"]["converted"]]
    lines += [f"llama.cpp converts {len(converted)} of {len(payload['rows'])} extended folders and "
              f"{len(base_converted)} of their bases; it refuses {len(refused)} ({', '.join(refused) or 'none'}); "
              f"extended folders refused where their base converts: {', '.join(lost) if lost else 'none'}."]
    lines += ["", "Where GGUF conversion was refused, llama.cpp's message:"]
    lines += [f"- {row['case']}: {row['gguf']['error']}" for row in payload["rows"]
              if row["exit_code"] == 0 and not row["gguf"]["converted"]]
    lines += ["", "New tokens at their ids in the converted GGUF (token or text):"]
    lines += [f"- {row['case']}: {row['gguf']['new_tokens_at_their_ids']}" for row in payload["rows"]
              if row["exit_code"] == 0 and row["gguf"]["converted"]]
    lines += ["", "New tokens on reserved ids (the reserved tokens they replaced, first .. last, with their ids; "
              "the embedding keeps its rows):"]
    lines += [f"- {row['case']}: {len(row['reserved_tokens'])} taken, `{row['reserved_tokens'][0]['reserved']}` "
              f"({row['reserved_tokens'][0]['id']:,}) .. `{row['reserved_tokens'][-1]['reserved']}` "
              f"({row['reserved_tokens'][-1]['id']:,})"
              for row in payload["rows"] if row["exit_code"] == 0 and row.get("reserved_tokens")] or ["- none"]
    lines += ["", "Terms a family could not take as one token, and why:"]
    lines += [f"- {row['case']}: {term}: {why}" for row in payload["rows"] if row["exit_code"] == 0
              for term, why in row["skipped"].items()] or ["- none"]
    lines += ["", f"Machine: {payload['machine']}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=[], help="run only cases whose id contains one of these")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--report", type=Path, help="rewrite the .md from an existing .json and stop")
    args = parser.parse_args()
    if args.report:
        payload = json.loads(args.report.read_text())
        args.report.with_suffix(".md").write_text(report(payload))
        return 0
    from extension.plan.models import ModelSources

    os.environ.setdefault("TIDE_CACHE_DIR", str(REPO / ".cache"))
    sources = ModelSources(cache_dir=Path(os.environ["TIDE_CACHE_DIR"]))
    from tests.vision_libs import enable, missing

    no_vision = missing()
    if not no_vision:
        enable()  # before transformers is imported, so it sees torchvision (tests/vision_libs.py says why)
    import torch
    import transformers

    rows, not_run = [], []
    with tempfile.TemporaryDirectory(prefix="tide-families-") as tmp:
        folder = Path(tmp)
        (folder / "terms.txt").write_text("\n".join(TERMS) + "\n", encoding="utf-8")
        (folder / "corpus.txt").write_text(corpus_text(), encoding="utf-8")
        for case in CASES:
            if args.cases and not any(part in case.id for part in args.cases):
                continue
            if case.architecture in NEEDS_VISION_LIBS and no_vision:
                not_run.append((case.id, no_vision))
                continue
            rows.append(run_case(case, folder, folder / "terms.txt", folder / "corpus.txt", sources))
            print(json.dumps({k: rows[-1].get(k) for k in ("case", "exit_code", "seconds", "checks", "gguf")}), flush=True)
    payload = {
        "command": "python benchmarks/model_families.py" + (f" --cases {' '.join(args.cases)}" if args.cases else ""),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, transformers {transformers.__version__}",
        "families": {name: {"gguf": f.gguf, "layout": f.layout} for name, f in FAMILIES.items()},
        "rows": rows,
        "not_run": not_run,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=sorted))
    args.out.write_text(report(payload))
    print(report(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
