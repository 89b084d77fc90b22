"""`tide keys create | list | revoke` against the service's database, as an operator runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import settings_env

TIDE = str(Path(sys.executable).with_name("tide"))


def tide(service_settings, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TIDE, *args], env=settings_env(service_settings), capture_output=True, text=True, timeout=60)


def _bytes_on_disk(*paths: Path) -> bytes:
    """The files' bytes, read by another process. Closing any descriptor of a file drops every
    POSIX lock this process holds on it, so reading the live database here would drop the API's
    SQLite locks: the next process to close its last connection then deletes the WAL index under
    the API, whose reads stay stale from then on (a later job stayed "queued" after it succeeded)."""
    script = "import sys, pathlib; sys.stdout.buffer.write(b''.join(p.read_bytes() for p in map(pathlib.Path, sys.argv[1:]) if p.exists()))"
    return subprocess.run([sys.executable, "-c", script, *map(str, paths)], capture_output=True, check=True, timeout=60).stdout


def test_create_list_revoke(client, service_settings):
    created = tide(service_settings, "keys", "create", "ops-team")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("tide_") and len(key) > 40 and "shown only once" in created.stderr
    headers = {"Authorization": f"Bearer {key}"}
    assert client.get("/jobs", headers=headers).status_code == 200

    listing = tide(service_settings, "keys", "list")
    assert "ops-team" in listing.stdout and key[:12] in listing.stdout and key not in listing.stdout

    revoked = tide(service_settings, "keys", "revoke", key[:12])
    assert revoked.returncode == 0 and "ops-team" in revoked.stdout
    assert client.get("/jobs", headers=headers).status_code == 401
    again = tide(service_settings, "keys", "revoke", "ops-team")
    assert again.returncode == 2 and "no active key" in again.stderr


def test_keys_are_stored_hashed(app, service_settings):
    key = tide(service_settings, "keys", "create", "hash-check").stdout.strip()
    raw = _bytes_on_disk(service_settings.data_dir / "tide.db", Path(str(service_settings.data_dir / "tide.db") + "-wal"))
    assert key.encode() not in raw
    import hashlib

    assert hashlib.sha256(key.encode()).hexdigest().encode() in raw


def test_serve_and_worker_are_commands():
    for command in ("serve", "worker"):
        out = subprocess.run([TIDE, command, "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    assert "--port" in subprocess.run([TIDE, "serve", "--help"], capture_output=True, text=True).stdout
