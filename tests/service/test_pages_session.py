"""Browser sign-in through the real app (TestClient, real SQLite; no worker needed): the key is
exchanged for a session cookie that the API accepts beside bearer keys, state changes need the
page's CSRF token, sign-out and revocation end the session, redirects stay on this site."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient


@pytest.fixture()
def browser_client(app):
    # A client of its own: its cookie jar must not leak into the shared `client` fixture.
    with TestClient(app, base_url="http://testserver") as fresh:
        yield fresh


def _sign_in(http, key: str, next_page: str = "/ui/jobs"):
    return http.post("/ui/login", data={"api_key": key, "next": next_page}, follow_redirects=False)


def _csrf(http) -> str:
    return re.search(r'name="csrf-token" content="([0-9a-f]+)"', http.get("/ui/jobs").text).group(1)


def test_pages_send_a_visitor_to_sign_in_first(browser_client):
    response = browser_client.get("/ui/jobs/job_123", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/ui/login?next=/ui/jobs/job_123"
    assert browser_client.get("/", follow_redirects=False).headers["location"] == "/ui/jobs"


def test_a_wrong_key_gets_401_and_is_not_echoed(browser_client):
    wrong = "tide_" + "w" * 43
    response = _sign_in(browser_client, wrong)
    assert response.status_code == 401 and "not valid or has been revoked" in response.text
    assert wrong not in response.text and "tide_session" not in response.headers.get("set-cookie", "")
    empty = _sign_in(browser_client, "  ")
    assert empty.status_code == 401 and "Enter your API key" in empty.text


def test_the_session_cookie_is_httponly_samesite_and_not_the_key(browser_client, api_key):
    response = _sign_in(browser_client, api_key, "/ui/new")
    assert response.status_code == 303 and response.headers["location"] == "/ui/new"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie
    assert api_key not in cookie and api_key not in response.headers["location"]
    page = browser_client.get("/ui/new")
    assert page.status_code == 200 and api_key not in page.text
    assert page.headers["cache-control"] == "no-store" and "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_the_api_accepts_the_cookie_and_state_changes_need_the_csrf_token(browser_client, api_key):
    _sign_in(browser_client, api_key)
    assert browser_client.get("/jobs").status_code == 200  # reading: the cookie is enough
    body = {"base_model": "tiny-llama", "terms": ["hypertext"], "training": {"steps": 0}}
    forged = browser_client.post("/extend", json=body)
    assert forged.status_code == 403
    assert forged.json()["error"] == {
        "code": "csrf_token_invalid", "param": "X-CSRF-Token",
        "message": forged.json()["error"]["message"],
    } and "reload the page" in forged.json()["error"]["message"]
    wrong = browser_client.post("/extend", json=body, headers={"X-CSRF-Token": "0" * 64})
    assert wrong.status_code == 403
    accepted = browser_client.post("/extend", json=body, headers={"X-CSRF-Token": _csrf(browser_client)})
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["id"]
    # the job belongs to the key behind the session
    assert browser_client.get(f"/jobs/{job_id}").json()["id"] == job_id
    cancelled = browser_client.post(f"/jobs/{job_id}/cancel", headers={"X-CSRF-Token": _csrf(browser_client)})
    assert cancelled.status_code == 200


def test_a_bearer_key_wins_over_a_cookie(browser_client, api_key, other_key):
    _sign_in(browser_client, api_key)
    mine = {job["id"] for job in browser_client.get("/jobs").json()["data"]}
    theirs = browser_client.get("/jobs", headers={"Authorization": f"Bearer {other_key}"})
    assert theirs.status_code == 200 and not mine & {job["id"] for job in theirs.json()["data"]}


def test_sign_out_ends_the_session_everywhere(browser_client, api_key):
    _sign_in(browser_client, api_key)
    token = browser_client.cookies["tide_session"]
    # without the page's token, a sign-out request (e.g. from another site) does nothing
    browser_client.post("/ui/logout", data={"csrf": "nope"}, follow_redirects=False)
    assert browser_client.get("/jobs").status_code == 200
    out = browser_client.post("/ui/logout", data={"csrf": _csrf(browser_client)}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/ui/login?signed_out=true"
    browser_client.cookies.set("tide_session", token)  # a copy of the old cookie is dead too
    stale = browser_client.get("/jobs")
    assert stale.status_code == 401 and stale.json()["error"]["code"] == "session_expired"
    assert browser_client.get("/ui/jobs", follow_redirects=False).headers["location"].startswith("/ui/login")


def test_revoking_the_key_ends_its_sessions(browser_client, app):
    from app.db.keys import create_key, revoke

    with app.state.sessions() as db:
        key, plaintext = create_key(db, "short-lived")
    _sign_in(browser_client, plaintext)
    assert browser_client.get("/jobs").status_code == 200
    with app.state.sessions() as db:
        revoke(db, [db.merge(key)])
    assert browser_client.get("/jobs").status_code == 401


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/\\evil.example", "/jobs", "javascript:alert(1)"])
def test_sign_in_redirects_only_to_our_own_pages(browser_client, api_key, target):
    response = _sign_in(browser_client, api_key, target)
    assert response.status_code == 303 and response.headers["location"] == "/ui/jobs"


def test_another_keys_job_page_is_a_404_page(browser_client, client, api_key, other_key):
    theirs = client.post(
        "/extend", json={"base_model": "tiny-llama", "terms": ["hypertext"], "training": {"steps": 0}},
        headers={"Authorization": f"Bearer {other_key}"},
    ).json()["id"]
    client.post(f"/jobs/{theirs}/cancel", headers={"Authorization": f"Bearer {other_key}"})
    _sign_in(browser_client, api_key)
    page = browser_client.get(f"/ui/jobs/{theirs}")
    assert page.status_code == 404 and "no job" in page.text and "text/html" in page.headers["content-type"]
