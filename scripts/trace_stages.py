"""How far a reader travels to follow a job: the modules of extension/ that the calls of
`pipeline.run` which receive the job's spec pass through, and how often that path returns to a
module it had left.

    .venv/bin/python scripts/trace_stages.py [--calls 400] [--job terms|corpus]   (--calls 0: the whole job)

Runs a small job (the tests' tiny random Llama with a real BPE tokenizer, a few training steps)
under sys.setprofile and counts, over the first N calls into extension/ that get the job's spec
(an ExtendSpec as an argument: the one run() got, or the plan's copy with its device's options): the distinct modules entered, and the returns (a
call into a module other than the previous one's that was entered before).
Written for issue 36, run on the tree before and after its move; works on both layouts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def tiny_model() -> Path:
    from tests.conftest import CACHE
    from tests.service.conftest import build_tiny_model

    target = CACHE / "service-tiny-llama"
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        build_tiny_model(target)
    return target


def job_spec(kind: str, work: Path):
    try:
        from extension.plan.spec import ExtendSpec
    except ImportError:  # the layout before issue 36
        from extension.spec import ExtendSpec
    from tests.service.conftest import foldoc_documents

    common = dict(base_model=str(tiny_model()), out_dir=work / "out", steps=4, batch_size=2, seq_len=32, device="cpu")
    if kind == "corpus":
        corpus = work / "corpus.txt"
        corpus.write_text("\n\n".join(foldoc_documents(400)))
        return ExtendSpec(corpus_path=corpus, max_new_tokens=20, **common)
    return ExtendSpec(terms=["hexadecimal", "microprocessor", "compiler", "bytecode"], **common)


def trace(kind: str, calls: int) -> dict:
    from extension import pipeline

    package = str(ROOT / "extension") + "/"
    entered: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and (not calls or len(entered) < calls) and frame.f_code.co_filename.startswith(package):
            code = frame.f_code
            arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            if any(type(frame.f_locals.get(name)).__name__ == "ExtendSpec" for name in arguments):
                entered.append(code.co_filename[len(package):])

    with tempfile.TemporaryDirectory() as work:
        spec = job_spec(kind, Path(work))
        sys.setprofile(profile)
        try:
            pipeline.run(spec)
        finally:
            sys.setprofile(None)
    seen, returns, previous = set(), 0, None
    for module in entered:
        if module != previous and module in seen:
            returns += 1
        seen.add(module)
        previous = module
    path = [m for i, m in enumerate(entered) if i == 0 or entered[i - 1] != m]
    return {"calls": len(entered), "modules": len(seen), "returns": returns, "path": path,
            "entered": {m: sum(1 for i, x in enumerate(entered) if x == m and (i == 0 or entered[i - 1] != m)) for m in sorted(seen)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--job", choices=("terms", "corpus"), default="terms")
    args = parser.parse_args()
    result = trace(args.job, args.calls)
    print(f"{args.job} job, {result['calls']} calls that get the spec: {result['modules']} modules, "
          f"{result['returns']} returns to a module already left")
    print("  path: " + " -> ".join(module.removesuffix(".py") for module in result["path"]))


if __name__ == "__main__":
    main()
