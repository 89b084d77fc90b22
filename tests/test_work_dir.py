"""`tide extend --work-dir`: a rerun of the same job resumes; a reused folder for other terms starts
fresh and says so (its checkpoint and generated contexts belong to another run)."""

from __future__ import annotations

import json


def _extend(tmp_path, model_dir, terms: list[str], out: str, steps: int = 3) -> int:
    from app.cli import main

    terms_file = tmp_path / f"{out}.txt"
    terms_file.write_text("\n".join(terms) + "\n")
    return main([
        "extend", "--base-model", str(model_dir), "--terms", str(terms_file), "--out", str(tmp_path / out),
        "--work-dir", str(tmp_path / "work"), "--steps", str(steps), "--batch-size", "2", "--seq-len", "32",
        "--checkpoint-every", "1", "--eval-bytes", "1000",
    ])


def _trained_steps(out_dir) -> list[int]:
    return [h["step"] for h in json.loads((out_dir / "metrics.json").read_text())["training"]["history"]]


def test_reused_work_dir_with_other_terms_starts_fresh_and_says_so(tmp_path, tiny_model_dir, capfd):
    assert _extend(tmp_path, tiny_model_dir, ["compiler", "interrupt"], "first") == 0
    capfd.readouterr()
    assert _trained_steps(tmp_path / "first") == [1, 2, 3]

    # same terms, same folder: the finished run is recognised, nothing is retrained
    assert _extend(tmp_path, tiny_model_dir, ["compiler", "interrupt"], "again") == 0
    assert "checkpoint of another run" not in capfd.readouterr().err
    assert _trained_steps(tmp_path / "again") == [1, 2, 3]
    again = json.loads((tmp_path / "again" / "tide_extension.json").read_text())
    assert again["trained_steps"] == 3

    # other terms (the same number of rows): the old rows must not be resumed
    assert _extend(tmp_path, tiny_model_dir, ["semaphore", "bytecode"], "other") == 0
    err = capfd.readouterr().err
    assert "the work folder holds a checkpoint of another run" in err and "new_tokens" in err
    assert _trained_steps(tmp_path / "other") == [1, 2, 3]


def test_model_card_reports_the_steps_done(tmp_path, tiny_model_dir):
    assert _extend(tmp_path, tiny_model_dir, ["compiler"], "out", steps=2) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "trained for 2 steps" in card
