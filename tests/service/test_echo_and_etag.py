"""Issue 38, item 8, against a real uvicorn: an error message quotes what the client sent only
cut to a length a person reads (a 100 KB job id gave a 100 KB 404 body), and a download whose
ETag the client already holds (`If-None-Match`) answers 304 without the file (it sent all of it
with 200)."""

from __future__ import annotations

import json

from .test_api_races import _publish, api  # noqa: F401  (the module's served API, as a fixture)

LONG = "job_" + "7" * 100_000


def test_an_error_quotes_a_huge_input_cut_short(api):  # noqa: F811
    job_id = _publish(api)["id"]
    for method, path in (
        ("GET", f"/jobs/{LONG}"),
        ("GET", f"/jobs/{LONG}/events"),
        ("GET", f"/jobs/{LONG}/archive"),
        ("GET", f"/jobs/{LONG}/artifacts"),
        ("POST", f"/jobs/{LONG}/cancel"),
        ("DELETE", f"/jobs/{LONG}"),
        ("DELETE", f"/files/file_{'7' * 100_000}"),
        ("GET", f"/no/such/route/{'x' * 100_000}"),
        ("PUT", f"/jobs/{LONG}"),
        ("GET", f"/jobs/{job_id}/artifacts/{'x' * 100_000}"),
    ):
        status, _headers, body = api.call(method, path)
        assert status in (404, 405), (method, path[:60], status, body[:300])
        assert len(body) < 1500, (method, path[:60], status, len(body), body[:300])
        error = json.loads(body)["error"]
        assert "7777777777" in error["message"] or "xxxxxxxxxx" in error["message"], error  # still names what was sent
        assert "characters" in error["message"], error  # and says it was cut


def test_if_none_match_with_the_etag_answers_304(api):  # noqa: F811
    job = _publish(api)
    for path in (f"/jobs/{job['id']}/archive", f"/jobs/{job['id']}/artifacts/tokenizer.json"):
        status, headers, body = api.call("GET", path)
        assert status == 200 and len(body) == int(headers["content-length"])
        etag = headers["etag"]
        for condition in (etag, f"W/{etag}", f'"other", {etag}', "*"):
            status, not_modified, body = api.call("GET", path, headers={"If-None-Match": condition})
            assert (status, body) == (304, b""), (path, condition, status, body[:200])
            assert not_modified["etag"] == etag and "content-length" not in not_modified, not_modified
            # a Range is not looked at once the client's copy is current (RFC 9110 section 13.2.2)
            assert api.call("GET", path, headers={"If-None-Match": condition, "Range": "bytes=0-9"})[0] == 304
            assert api.call("HEAD", path, headers={"If-None-Match": condition})[0] == 304
        status, _, body = api.call("GET", path, headers={"If-None-Match": '"another-version"'})
        assert status == 200 and len(body) == int(headers["content-length"])
