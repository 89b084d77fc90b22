"""What a CLI user sees (issue 37, item 8): the README's first command prints no third-party
warnings. PEFT's "no implementation exists to tie the adapters" is handled where it arises (the
adapter, extension/publishing/folder.py); deprecation noise from libraries is logged, not printed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

from app.cli_warnings import deprecations_logged
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
    # that an init-only terms job was published without being judged against the base model
    import json

    devices = json.loads((tmp_path / "out" / "metrics.json").read_text())["devices"]
    card = (tmp_path / "out" / "README.md").read_text()
    for text in (done.stdout, card):
        assert "NOT judged against the base model" in text
        assert f"figures were measured {'in' if devices['evaluate']['dtype'] == devices['publish']['dtype'] else 'with the model computing in'} {devices['evaluate']['dtype']}" in text


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
