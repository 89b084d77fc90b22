"""A throwaway PostgreSQL cluster of the test's own: `initdb` in a temporary folder, a server on a
free loopback port (and its socket in that folder), a fresh database per test, everything removed
at the end. Debian's `postgresql` package provides the binaries (scripts/setup.sh installs it);
the server refuses to run as root, so as root it runs as the `postgres` user. Nothing is skipped:
a machine without the binaries fails the test, naming the package."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from .conftest import free_port


def _binary(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if not found:
        pytest.fail(
            f"these tests run a real PostgreSQL and {name} is not installed: run scripts/setup.sh "
            "(it installs Debian's postgresql package)", pytrace=False,
        )
    return found


class PostgresCluster:
    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tide-pg-"))  # not under pytest's root-only tmp folders
        self.data = self.folder / "data"
        self.port = free_port()
        self.user = "tide"
        # postgres will not run as root: then the server runs as the postgres user
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.run_as:
            owner = pwd.getpwnam("postgres")
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)

    def _run(self, *command: str, timeout: float = 120) -> None:
        done = subprocess.run([*self.run_as, *command], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            log = self.folder / "server.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise AssertionError(f"{command[0]} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}\n{tail}")

    def start(self) -> PostgresCluster:
        self._run(_binary("initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8", "--no-locale")
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run(_binary("pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "server.log"), "-o", options, "-w", "-t", "60", "start")
        return self

    def new_database(self) -> str:
        """A fresh, empty database; its SQLAlchemy URL (the driver TIDE's deployments use, psycopg 3)."""
        import psycopg

        name = f"tide_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres", autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(_binary("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres_cluster():
    cluster = PostgresCluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()
