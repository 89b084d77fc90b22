"""Does a published checkpoint convert with llama.cpp's own converter?

llama.cpp's `convert_hf_to_gguf.py` (vendored in the `llama-cpp-python` sdist on PyPI; no build
needed to convert) identifies a BPE pre-tokenizer by hashing the ids of a probe text, and
refuses a tokenizer it does not recognise. This script downloads that sdist once, converts a
published folder (or extends the built-in model first), and checks the GGUF's vocabulary holds
every new token and merge.

    .venv/bin/python benchmarks/gguf_convert_check.py [--model-dir PUBLISHED] [--keep]

Writes benchmarks/results/gguf_convert.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.model_families import SDIST, llama_cpp_dir  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "gguf_convert.md"


def converter() -> tuple[Path, Path]:
    """(convert_hf_to_gguf.py, its own gguf-py folder), from the sdist scripts/setup.sh fetches."""
    root = llama_cpp_dir()
    return root / "convert_hf_to_gguf.py", root / "gguf-py"


def extend_builtin(out: Path) -> Path:
    subprocess.run([str(REPO / ".venv/bin/tide"), "extend", "--base-model", "smollm2-135m", "--terms",
                    str(REPO / "examples/terms.txt"), "--steps", "0", "--eval-bytes", "2000", "--out", str(out),
                    "--force"], check=True)
    return out


def convert(model_dir: Path, outfile: Path) -> tuple[bool, str, float]:
    script, gguf_py = converter()
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script), str(model_dir), "--outfile", str(outfile), "--outtype", "f16"],
        env={"PYTHONPATH": str(gguf_py), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": "/tmp"},
        capture_output=True, text=True,
    )
    return proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:], time.perf_counter() - started


def gguf_vocab(path: Path) -> tuple[list[str], int, str]:
    _, gguf_py = converter()
    sys.path.insert(0, str(gguf_py))
    from gguf import GGUFReader

    reader = GGUFReader(path)

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = len(reader.fields["tokenizer.ggml.merges"].data) if "tokenizer.ggml.merges" in reader.fields else 0
    pre = strings("tokenizer.ggml.pre")[0] if "tokenizer.ggml.pre" in reader.fields else "?"
    return tokens, merges, pre


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="a published TIDE folder (default: extend smollm2-135m now)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or extend_builtin(Path(tmp) / "extended")
        extension = json.loads((model_dir / "tide_extension.json").read_text())
        ok, log, seconds = convert(model_dir, Path(tmp) / "model.gguf")
        lines = [
            "# llama.cpp GGUF conversion of a published checkpoint",
            "",
            f"Command: `.venv/bin/python benchmarks/gguf_convert_check.py` (converter from `{SDIST}`'s vendored "
            "llama.cpp, `--outtype f16`).",
            "",
            f"- model: `{extension['base_model']['name']}` + {extension['counts']['terms_added']} terms, "
            f"{extension['counts']['new_vocab_entries']} new vocabulary entries, {len(extension['merges'])} new merges",
            f"- conversion: {'succeeded' if ok else 'FAILED'} in {seconds:.0f} s",
        ]
        if ok:
            tokens, merges, pre = gguf_vocab(Path(tmp) / "model.gguf")
            missing = [t["token"] for t in extension["new_tokens"] if t["id"] >= len(tokens) or tokens[t["id"]] != t["token"]]
            lines += [
                f"- GGUF pre-tokenizer recognised as `{pre}`; vocabulary {len(tokens):,} entries "
                f"(config vocab {extension['vocab']['vocab_size']:,}); {merges:,} merges",
                f"- new tokens at their ids in the GGUF: {len(extension['new_tokens']) - len(missing)}"
                f"/{len(extension['new_tokens'])}" + (f" (missing: {missing[:5]})" if missing else ""),
            ]
        else:
            lines += ["", "```", log, "```"]
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
