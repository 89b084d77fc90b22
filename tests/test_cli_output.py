"""What a CLI user sees (issue 37, items 4 and 8): the README's first command prints no third-party
warnings, and the summary, card and tide_extension.json say which precision the figures were
scored in and which dtype the published weights are. PEFT's "no implementation exists to tie the adapters" is handled where it arises (the
adapter, extension/publishing/folder.py); deprecation noise from libraries is logged, not printed."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings

import pytest

from app.cli_warnings import deprecations_logged
from extension.plan.devices import safetensors_header
from tests.conftest import REPO


def test_a_first_run_through_the_cli_prints_no_warnings(tiny_model_dir, tmp_path):
    """`tide extend ... --steps 0` as the README runs it, in its own process (pytest would catch
    the warnings a terminal shows): its output holds the summary and no warning."""
    terms = tmp_path / "terms.txt"
    terms.write_text("hypertext\ncompiler\nfirmware\n", encoding="utf-8")
    env = {**os.environ, "TIDE_DATA_DIR": str(tmp_path / "data"), "TIDE_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "extend", "--base-model", str(tiny_model_dir), "--terms", str(terms),
         "--steps", "0", "--eval-bytes", "1000", "--out", str(tmp_path / "out"), "--force"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Extended model written to" in done.stdout
    printed = done.stdout + done.stderr
    assert "Warning" not in printed, [line for line in printed.splitlines() if "Warning" in line]
    # issue 37 items 4 and 5: the summary and the card say what the figures were measured in, and
    # that an init-only terms job decided nothing and was judged only on text the base model wrote
    import json

    devices = json.loads((tmp_path / "out" / "metrics.json").read_text())["devices"]
    card = (tmp_path / "out" / "README.md").read_text()
    for text in (done.stdout, card):
        assert "Which terms stay was NOT decided: its input rows were distilled" in " ".join(text.split())
        assert "On held-out contexts the base model wrote for your terms, not your text" in " ".join(text.split())
        assert f"figures were measured {'in' if devices['evaluate']['dtype'] == devices['publish']['dtype'] else 'with the model computing in'} {devices['evaluate']['dtype']}" in text


@pytest.mark.parametrize("precision, scored_in", [("auto", "bfloat16"), ("checkpoint", "float32")])
def test_the_card_summary_and_json_say_what_precision_was_scored_and_what_is_published(
        precision, scored_in, tmp_path, tiny_model_dir, cli_cache, capsys, monkeypatch):
    """Issue 37 item 4 through `tide extend`: on a CPU that computes bf16 in hardware (made so
    here, whatever this CPU is) precision auto scores the bf16 model and publishes the fp32
    checkpoint; precision checkpoint scores and publishes fp32. Summary, card and
    tide_extension.json each say which, the sentence right under the figures it qualifies."""
    from app.cli import main
    from extension.plan import devices

    monkeypatch.setattr(devices, "cpu_computes_bf16", lambda: True)
    terms = tmp_path / "terms.txt"
    terms.write_text("hypertext\ncompiler\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["extend", "--base-model", str(tiny_model_dir), "--terms", str(terms), "--steps", "0", "--device", "cpu",
                 "--precision", precision, "--eval-bytes", "1000", "--out", str(out)]) == 0
    summary = capsys.readouterr().out.splitlines()
    card = (out / "README.md").read_text()
    recorded = json.loads((out / "tide_extension.json").read_text())["evaluation_precision"]
    # the published weights are the fp32 checkpoint's either way
    assert {entry["dtype"] for entry in safetensors_header(out / "model.safetensors").values()
            if isinstance(entry, dict) and "dtype" in entry} == {"F32"}
    if scored_in == "bfloat16":
        said = ("The before/after figures were measured with the model computing in bfloat16; the published weights "
                "are float32")
        assert recorded["published_weights_scored"] is False
    else:
        said = "The before/after figures were measured in float32, the published weights' dtype."
        assert recorded["published_weights_scored"] is True
    assert (recorded["scored_in"], recorded["published_dtype"]) == (scored_in, "float32")
    assert recorded["said"].startswith(said)
    # the summary: the sentence once, on the line after the last bits-per-byte figure
    figures = [i for i, line in enumerate(summary) if "_per_byte: " in line]
    assert figures and summary[figures[-1] + 1].strip().startswith(said)
    assert sum(said in line for line in summary) == 1
    # the card: once, right under the before/after table and its "Measured on" note
    assert card.count(said) == 1
    after_table = [line for line in card[card.index("## Before / after"):].splitlines()[1:] if line.strip()]
    noted = next(i for i, line in enumerate(after_table) if line.startswith("Measured on"))
    assert all(line.startswith("|") for line in after_table[:noted]) and after_table[noted + 1].startswith(said)


def test_third_party_deprecations_are_logged_and_other_warnings_still_shown(caplog):
    third_party = "/usr/lib/python3/dist-packages/somelib/core.py"
    shown: list[str] = []
    with warnings.catch_warnings(), caplog.at_level(logging.INFO, logger="tide.warnings"):
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *rest, **kw: shown.append(str(message))  # what a terminal would print
        with deprecations_logged():
            warnings.warn_explicit("`old_api` is deprecated", FutureWarning, third_party, 10)
            warnings.warn_explicit("old call", DeprecationWarning, third_party, 11)
            warnings.warn_explicit("your model looks odd", UserWarning, third_party, 12)
            warnings.warn_explicit("our own deprecation", FutureWarning, str(REPO / "extension" / "x.py"), 13)
        warnings.warn_explicit("after the block", FutureWarning, third_party, 14)
    assert shown == ["your model looks odd", "our own deprecation", "after the block"]
    logged = [record.getMessage() for record in caplog.records if record.name == "tide.warnings"]
    assert len(logged) == 2 and "FutureWarning: `old_api` is deprecated" in logged[0]
