"""Issue 13 item 7, the archive: no second copy of the model on disk. The tar is laid out from the
model folder and produced as it is sent, so its bytes must be exactly what `tarfile` writes, the
same on every request, and any byte range of it must be servable (resumed downloads)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from app.errors import ApiError, error_response

from app.downloads import ArchiveResponse
from app.storage import ArchiveLayout

MTIME = 1_700_000_000


@pytest.fixture()
def model_folder(tmp_path):
    folder = tmp_path / "model"
    (folder / "adapter").mkdir(parents=True)
    sizes = {"config.json": 700, "model.safetensors": 300_001, "adapter/adapter_model.safetensors": 512, "empty.txt": 0,
             "a_name_longer_than_the_hundred_characters_a_plain_ustar_header_can_hold_" + "x" * 40 + ".json": 5}
    for name, size in sizes.items():
        (folder / name).write_bytes(os.urandom(size))
    return folder


def _tarfile_bytes(folder) -> bytes:
    """What Python's own tar writer makes of the same members."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.relative_to(folder).as_posix()):
            info = tarfile.TarInfo(f"job_x/{path.relative_to(folder).as_posix()}")
            info.size, info.mtime, info.mode = path.stat().st_size, MTIME, 0o644
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


def test_the_laid_out_archive_is_what_tarfile_writes_and_unpacks_to_the_folder(model_folder, tmp_path):
    layout = ArchiveLayout(model_folder, "job_x", MTIME)
    with layout.open() as reader:
        data = reader.read(layout.size + 100)
    assert len(data) == layout.size and data == _tarfile_bytes(model_folder)
    assert layout.sha256() == hashlib.sha256(data).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(tmp_path / "out", filter="data")
        assert {m.mtime for m in tar.getmembers()} == {MTIME} and {(m.uid, m.gid) for m in tar.getmembers()} == {(0, 0)}
    for path in model_folder.rglob("*"):
        if path.is_file():
            assert (tmp_path / "out" / "job_x" / path.relative_to(model_folder)).read_bytes() == path.read_bytes()
    # nothing was written beside the folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out"]


def test_any_byte_range_of_the_archive_is_served_and_resumes(model_folder):
    layout = ArchiveLayout(model_folder, "job_x", MTIME)
    with layout.open() as reader:
        whole = reader.read(layout.size)
    sha = hashlib.sha256(whole).hexdigest()
    app = Starlette(routes=[Route("/archive", lambda _request: ArchiveResponse(
        ArchiveLayout(model_folder, "job_x", MTIME), filename="job_x.tar", sha256=sha, mtime=MTIME))],
        exception_handlers={ApiError: lambda _request, exc: error_response(exc.status, exc.code, exc.message, exc.param, exc.headers)})
    client = TestClient(app)

    full = client.get("/archive")
    assert full.status_code == 200 and full.content == whole
    assert full.headers["content-length"] == str(layout.size) and full.headers["etag"] == f'"{sha}"'
    # a download broken at every kind of boundary (inside a header, inside a file, in padding) resumes
    for cut in (1, 511, 512, 700, 1024, 150_000, layout.size - 1):
        rest = client.get("/archive", headers={"Range": f"bytes={cut}-", "If-Range": full.headers["etag"]})
        assert rest.status_code == 206 and rest.headers["content-range"] == f"bytes {cut}-{layout.size - 1}/{layout.size}"
        assert whole[:cut] + rest.content == whole
    tail = client.get("/archive", headers={"Range": "bytes=-1000"})
    assert tail.status_code == 206 and tail.content == whole[-1000:]
    middle = client.get("/archive", headers={"Range": "bytes=100-199,300000-300099"})
    assert middle.status_code == 206 and whole[100:200] in middle.content and whole[300000:300100] in middle.content
    # the archive changed since (another ETag): the whole file again, never a mix
    stale = client.get("/archive", headers={"Range": "bytes=1000-", "If-Range": '"something-else"'})
    assert stale.status_code == 200 and stale.content == whole
    past_end = client.get("/archive", headers={"Range": f"bytes={layout.size}-"})
    assert past_end.status_code == 416 and past_end.json()["error"]["code"] == "range_not_satisfiable"
    assert past_end.headers["content-range"] == f"bytes */{layout.size}"
    # an unparseable Range is ignored (RFC 9110): the whole archive
    for header in ("bytes=oops", "bytes=--5", "bytes=+5-10"):
        ignored = client.get("/archive", headers={"Range": header})
        assert ignored.status_code == 200 and ignored.content == whole, header
    # HEAD: the headers of the whole archive, no body
    head = client.head("/archive")
    assert head.status_code == 200 and head.content == b"" and head.headers["content-length"] == str(layout.size)


def test_an_open_archive_reads_to_the_end_after_its_folder_is_deleted(model_folder):
    """Issue 25 item 6: the reader opens every member when it is made, so a job deleted while its
    archive downloads still sends every byte."""
    import shutil

    layout = ArchiveLayout(model_folder, "job_x", MTIME)
    whole = _tarfile_bytes(model_folder)
    with layout.open() as reader:
        head = reader.read(1000)
        shutil.rmtree(model_folder)
        rest = reader.read(layout.size)
    assert head + rest == whole
    with pytest.raises(OSError):
        layout.open()  # a reader made after the delete fails at once, before anything is sent
