"""What a terms-only job's context writing costs on this machine, by batch size and context length
(issue 26, item 3).

A terms-only job first has the base model write short texts around every term
(extension.training.term_contexts.generate_texts: sampling, KV cache, left-padded prompts); on a CPU that is the
slow part of the job. This times that very function on the built-in SmolLM2-135M for a fixed set of
terms, side by side in one run, at several prompts-per-generate() batch sizes and sampled lengths,
and reports seconds per context and each setting's ratio to the product's current CPU setting.
One torch thread per run by default (a worker host shares its cores; see docs/measured.md).

    .venv/bin/python benchmarks/context_writing.py                 # writes benchmarks/results/context_writing.md
    .venv/bin/python benchmarks/context_writing.py --terms 8 --batches 8,16 --lengths 16 --out /tmp/c.md  # smoke
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from extension.training.term_contexts import generate_texts  # noqa: E402
from extension.plan.models import ModelSources, resolve_model  # noqa: E402
from extension.tokenizer import extend_tokenizer  # noqa: E402

# Real multi-piece words from several domains (computing, medicine, Spanish, CMake, Perl), so the
# prompts' lengths vary as a job's do.
TERMS = ("multiprogramming", "immunohistochemistry", "pharmacokinetics", "desafortunadamente", "CMAKE_CXX_STANDARD",
         "localtime", "hexadecimal", "nondeterministic", "ciprofloxacin", "corazonada", "add_subdirectory",
         "sprintf", "metasyntactic", "minicomputer", "Archimedes", "superintendencia", "target_link_libraries",
         "perlfunc", "bioavailability", "electroencephalography", "Netscape", "INTERCAL", "kilobytes", "megabyte",
         "Burroughs", "enhorabuena", "esternocleidomastoideo", "find_package", "unshift", "lexicographic",
         "thrombocytopenia", "interoperability")


BEFORE = (16, 64)  # (batch, sampled tokens) a CPU job used before issue 26


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", type=int, default=32, help=f"how many of the {len(TERMS)} built-in terms")
    parser.add_argument("--per-term", type=int, default=2, help="contexts per term")
    parser.add_argument("--batches", default="8,16,32,64", help="prompts per generate() call")
    parser.add_argument("--lengths", default="32,64", help="sampled tokens per context (the product writes 64)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "context_writing.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model("smollm2-135m", ModelSources(cache_dir=REPO / ".cache")).path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    extended = extend_tokenizer(tokenizer, TERMS[: args.terms])
    contexts = len(extended.terms) * args.per_term
    batches = [int(b) for b in args.batches.split(",")]
    lengths = [int(n) for n in args.lengths.split(",")]
    generate_texts(model, extended, per_term=1, max_new_tokens=4, batch_size=8)  # warm-up
    rows = []
    for length in lengths:
        for batch in batches:
            started = time.perf_counter()
            texts = generate_texts(model, extended, per_term=args.per_term, max_new_tokens=length, batch_size=batch)
            seconds = time.perf_counter() - started
            rows.append({"length": length, "batch": batch, "seconds": seconds, "per_context": seconds / len(texts)})
            print(rows[-1], flush=True)
    reference = next((r for r in rows if (r["batch"], r["length"]) == BEFORE), rows[0])
    lines = [
        "# Context writing for terms-only jobs: seconds per context by batch and length (issue 26)",
        "",
        "Command: `" + " ".join(["python benchmarks/context_writing.py", *sys.argv[1:]]) + "`",
        "",
        f"SmolLM2-135M-Instruct, fp32, CPU, {args.threads} torch thread(s); {len(extended.terms)} terms x "
        f"{args.per_term} contexts = {contexts} contexts per setting, written by extension.training.term_contexts.generate_texts "
        f"(the job's own function). Ratio: against batch {reference['batch']} x {reference['length']} tokens "
        f"(the product's CPU setting before issue 26: batch {BEFORE[0]}, {BEFORE[1]} tokens), same run.",
        "",
        "| sampled tokens | batch | seconds | s per context | vs product setting |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['length']} | {r['batch']} | {r['seconds']:.1f} | {r['per_context']:.2f} | "
                     f"{r['per_context'] / reference['per_context']:.2f}x |")
    lines += ["", f"Machine: {platform.machine()}, torch {torch.__version__}."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
