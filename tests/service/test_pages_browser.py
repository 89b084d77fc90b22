"""The pages in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium) against a real uvicorn, Redis, `tide worker` process and SQLite.

Sign in (a wrong key first), an invalid form, a tiny job watched to succeeded on its live page
(loss curve, before/after table, terms, files), the archive downloaded by the browser, another
job cancelled from its page, and no text overflowing at desktop width or on a 390-px-wide
phone. The tests run in file order and share one browser, as one user's visit would.

Screenshots go to $TIDE_SCREENSHOTS when set (docs/screenshots is made that way), else to a
temporary folder.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from .conftest import TINY_MODEL, foldoc_documents

pytestmark = pytest.mark.slow

TERMS = ["multiprogramming", "microprocessor", "hypertext"]
DESKTOP = (1280, 900)
PHONE = (390, 844)

# Elements whose content runs past their own box or past the viewport's right edge. Inline
# elements have no box of their own; visually hidden ones (clipped to 1 px for screen readers,
# like the phone layout's table headers) are cut on purpose.
OVERFLOW_CHECK = """
const width = window.innerWidth;
const clipped = (el) => {
  for (let node = el; node && node !== document.body; node = node.parentElement) {
    const style = getComputedStyle(node);
    if (style.position === 'absolute' && style.clip !== 'auto') return true;
  }
  return false;
};
const bad = [];
for (const el of document.body.querySelectorAll('*')) {
  if (el.closest('svg, option, datalist') || el.tagName === 'PROGRESS' || el.tagName === 'INPUT' || clipped(el)) continue;
  const style = getComputedStyle(el);
  if (style.display === 'none' || style.visibility === 'hidden' || el.getClientRects().length === 0) continue;
  const rect = el.getBoundingClientRect();
  const own = style.display !== 'inline' && el.scrollWidth > el.clientWidth + 1 && style.overflowX === 'visible';
  if (rect.right > width + 1 || own) {
    bad.push(el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (el.className && el.className.baseVal === undefined ? '.' + el.className : '')
             + ' right=' + Math.round(rect.right) + ' scroll=' + el.scrollWidth + '/' + el.clientWidth + ': ' + (el.textContent || '').trim().slice(0, 60));
  }
}
return [document.documentElement.scrollWidth, width, bad.slice(0, 10)];
"""


def _chromium_paths() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.fail(
            "the browser tests need Debian's chromium and chromium-driver; install them with "
            "`apt-get install -y chromium chromium-driver` (scripts/setup.sh does)", pytrace=False,
        )
    return browser, driver


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("browser-downloads")


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = Path(os.environ["TIDE_SCREENSHOTS"]) if os.environ.get("TIDE_SCREENSHOTS") else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser(downloads):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = _chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
                 "--disable-extensions", "--no-first-run", "--lang=en-US"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(what, timeout: float, message: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} (after {timeout:.0f} s)")
        time.sleep(poll)


def _text(driver, css: str) -> str:
    # One script call: the live regions replace their elements between two WebDriver calls.
    return driver.execute_script("const el = document.querySelector(arguments[0]); return el ? el.innerText : ''", css)


def _in_view(driver, element) -> bool:
    return driver.execute_script(
        "const r = arguments[0].getBoundingClientRect(); return r.top >= 0 && r.bottom <= window.innerHeight && r.width > 0;", element,
    )


def _viewport(driver, size: tuple[int, int]) -> None:
    width, height = size
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 500})


def _check_no_overflow(driver, where: str) -> None:
    page_width, width, bad = driver.execute_script(OVERFLOW_CHECK)
    assert page_width <= width and not bad, f"{where}: text overflows (page {page_width} px in a {width} px viewport): {bad}"


def _screenshot(driver, folder: Path, name: str) -> Path:
    """The whole page as a 16-colour PNG (text stays sharp; the file stays small)."""
    from PIL import Image

    height = driver.execute_script("return Math.ceil(document.querySelector('main').getBoundingClientRect().bottom + window.scrollY + 8)")
    width = driver.execute_script("return window.innerWidth")
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True, "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 6000), "scale": 1},
    })
    image = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
    path = folder / f"{name}.png"
    image.quantize(colors=16, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


def _sign_in(driver, live_server: str, key: str) -> None:
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.ID, "api_key")
    field.clear()
    field.send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()


def _fill(driver, element_id: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.ID, element_id)
    driver.execute_script("arguments[0].closest('details') && (arguments[0].closest('details').open = true)", field)
    field.clear()
    field.send_keys(text)


def _submit_form(driver) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "submit-job").click()


def _job_status(driver) -> str:
    return _text(driver, "#job-status").split(" ", 1)[-1]


def test_a_wrong_key_is_refused_beside_the_field(browser, live_server):
    from selenium.webdriver.common.by import By

    browser.get(f"{live_server}/ui/jobs")
    assert "/ui/login" in browser.current_url  # not signed in: sent to sign in first
    wrong = "tide_" + "x" * 43
    _sign_in(browser, live_server, wrong)
    error = _wait(lambda: browser.find_elements(By.ID, "api_key-error"), 10, "no error after a wrong key")[0]
    assert "not valid" in error.text and _in_view(browser, error)
    assert browser.find_element(By.ID, "api_key").get_attribute("aria-invalid") == "true"
    assert wrong not in browser.page_source and wrong not in browser.current_url


def test_sign_in_keeps_the_key_out_of_pages_urls_and_scripts(browser, live_server, api_key):
    _sign_in(browser, live_server, api_key)
    _wait(lambda: browser.current_url.endswith("/ui/jobs"), 10, "sign-in did not land on the job list")
    cookie = browser.get_cookie("tide_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and cookie["value"] != api_key
    assert api_key not in browser.page_source and api_key not in browser.current_url
    # HttpOnly: the page's scripts cannot read the session either
    assert "tide_session" not in browser.execute_script("return document.cookie")


def test_an_invalid_form_shows_the_servers_error_next_to_the_field(browser, live_server, api_key, service_settings, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(f"{live_server}/ui/new")
    # the form is the API's schema: every training option is there with its default
    from app.schemas import ExtendRequest

    defaults = ExtendRequest(base_model=TINY_MODEL)
    assert browser.find_element(By.ID, "opt-training-batch_size").get_attribute("value") == str(defaults.training.batch_size)
    # left empty, training.steps takes the worker's device's default, which the hint states
    assert defaults.training.steps is None and browser.find_element(By.ID, "opt-training-steps").get_attribute("value") == ""
    assert "400 on a GPU" in browser.find_element(By.ID, "opt-training-steps-hint").text
    assert float(browser.find_element(By.ID, "opt-training-lr").get_attribute("value")) == defaults.training.lr
    _fill(browser, "base_model", TINY_MODEL)
    _fill(browser, "terms_text", "\n".join(TERMS))
    _fill(browser, "opt-training-batch_size", "0")
    _submit_form(browser)
    error = _wait(lambda: _text(browser, "#opt-training-batch_size-error"), 10, "no error beside batch size")
    from extension.plan.options import BY_NAME

    assert error == f"Error: training.batch_size must be {BY_NAME['batch_size'].valid_range()}, got 0"
    assert _in_view(browser, browser.find_element(By.ID, "opt-training-batch_size-error"))
    assert browser.find_element(By.ID, "opt-training-batch_size").get_attribute("aria-invalid") == "true"

    # fixed; now a model the server does not offer: the old error goes, the new one sits by base_model
    _fill(browser, "opt-training-batch_size", "2")
    _fill(browser, "base_model", "llama-9000")
    _submit_form(browser)
    error = _wait(lambda: _text(browser, "#base_model-error"), 10, "no error beside base_model")
    assert "llama-9000" in error and not browser.find_element(By.ID, "opt-training-batch_size-error").is_displayed()

    # the upload route names its field "file": the error lands beside the corpus upload
    too_big = tmp_path / "huge.txt"
    too_big.write_text("word " * (service_settings.max_upload_bytes // 5 + 10), encoding="utf-8")
    _fill(browser, "base_model", TINY_MODEL)
    browser.find_element(By.ID, "corpus_file").send_keys(str(too_big))
    _submit_form(browser)
    error = _wait(lambda: _text(browser, "#corpus_file-error"), 10, "no error beside the corpus upload")
    assert "over this server's limit of" in error and "TIDE_MAX_UPLOAD_BYTES" in error
    assert "/ui/new" in browser.current_url
    jobs = httpx.get(f"{live_server}/jobs", headers={"Authorization": f"Bearer {api_key}"}).json()["data"]
    assert not any(job["base_model"] == "llama-9000" for job in jobs)


def test_a_job_submitted_in_the_form_is_watched_live_to_succeeded(browser, live_server, api_key, screenshots, downloads, tmp_path):
    from selenium.webdriver.common.by import By

    corpus = tmp_path / "foldoc.txt"  # the terms occur in it: trained on, and scored before/after
    corpus.write_text("\n\n".join(foldoc_documents(400, skip=3000)), encoding="utf-8")

    list_tab = browser.current_window_handle
    browser.get(f"{live_server}/ui/jobs")
    browser.execute_script("window.__loadedOnce = true")  # gone if the page ever reloads
    browser.switch_to.new_window("tab")
    form_tab = browser.current_window_handle
    browser.get(f"{live_server}/ui/new")
    _fill(browser, "base_model", TINY_MODEL)
    _fill(browser, "terms_text", "\n".join(TERMS))
    browser.find_element(By.ID, "corpus_file").send_keys(str(corpus))
    for option, value in (("steps", "24"), ("batch_size", "2"), ("seq_len", "64"), ("warmup_steps", "0")):
        _fill(browser, f"opt-training-{option}", value)
    _fill(browser, "opt-evaluation-max_bytes", "4000")
    _fill(browser, "opt-selection", "none")  # a random tiny model's terms never pay on validation: keep them
    _submit_form(browser)
    _wait(lambda: "/ui/jobs/job_" in browser.current_url, 15, "the form did not open the new job's page")
    job_id = browser.current_url.rsplit("/", 1)[-1]
    browser.execute_script("window.__loadedOnce = true")
    seen = set()

    def finished() -> bool:
        seen.add(_job_status(browser))
        return _job_status(browser) in ("succeeded", "failed", "cancelled")

    _wait(finished, 240, f"job {job_id} did not finish on its page", poll=0.1)
    assert _job_status(browser) == "succeeded", _text(browser, ".problem")
    assert seen & {"queued", "running"}, seen  # the page showed it before it finished, then updated itself
    assert browser.execute_script("return window.__loadedOnce") is True

    # stage timeline: every stage done
    stages = [li.text for li in browser.find_elements(By.CSS_SELECTOR, ".timeline li")]
    assert [s.split()[1] for s in stages] == ["load", "extend", "init", "generate", "train", "select", "evaluate", "publish"]
    assert all(s.startswith("✓") for s in stages), stages
    assert "24 of 24" in _text(browser, ".progress-line")
    # the loss curve: one point per step
    points = browser.find_element(By.CSS_SELECTOR, "#loss-curve polyline").get_attribute("points").split()
    assert len(points) == 24
    assert "Training loss" in browser.find_element(By.ID, "loss-curve").get_attribute("aria-label")
    # the before/after table holds the report's rows, and the verdict is in words
    rows = {row.get_attribute("data-key") for row in browser.find_elements(By.CSS_SELECTOR, "#comparison tbody tr")}
    metrics = httpx.get(f"{live_server}/jobs/{job_id}", headers={"Authorization": f"Bearer {api_key}"}).json()["metrics"]
    assert rows == set(metrics["comparison"]) and "domain_bits_per_byte" in rows and "domain_new_token_usage" in rows
    verdict = _text(browser, "#verdict")
    assert "held-out domain text" in verdict and "Your text takes" in verdict and "General English is" in verdict
    terms = _text(browser, "#terms")
    assert all(term in terms for term in TERMS) and "merges" in terms
    assert "model.safetensors" in _text(browser, "#files")
    assert "AutoModelForCausalLM.from_pretrained" in _text(browser, "#load-lines")

    # the archive, downloaded by the browser with its session cookie, is the published one
    browser.find_element(By.ID, "download-archive").click()
    archive = downloads / f"{job_id}.tar"
    manifest = httpx.get(f"{live_server}/jobs/{job_id}/artifacts", headers={"Authorization": f"Bearer {api_key}"}).json()
    _wait(lambda: archive.is_file() and archive.stat().st_size == manifest["archive"]["size"], 30, "the archive did not download")
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == manifest["archive"]["sha256"]

    # the list, loaded before the job existed, picked it up and followed it to the end by itself
    browser.switch_to.window(list_tab)
    _wait(lambda: "succeeded" in _text(browser, f'tr[data-job="{job_id}"]'), 30, "the job list did not follow the job")
    assert browser.execute_script("return window.__loadedOnce") is True

    browser.close()
    browser.switch_to.window(form_tab)
    for size, suffix in ((DESKTOP, "desktop"), (PHONE, "phone")):
        _viewport(browser, size)
        browser.refresh()
        _check_no_overflow(browser, f"job page at {size[0]} px")
        _screenshot(browser, screenshots, f"job-{suffix}")
        browser.get(f"{live_server}/ui/new")
        _check_no_overflow(browser, f"submit form at {size[0]} px")
        _screenshot(browser, screenshots, f"new-{suffix}")
        browser.back()
    _viewport(browser, DESKTOP)


def test_another_job_is_cancelled_from_its_page(browser, live_server, api_key, screenshots, tmp_path):
    from selenium.webdriver.common.by import By

    terms = tmp_path / "terms.txt"  # this time the terms come as a file
    terms.write_text("\ufeffhypertext\n\n", encoding="utf-8")
    browser.get(f"{live_server}/ui/new")
    _fill(browser, "base_model", TINY_MODEL)
    browser.find_element(By.ID, "terms_file").send_keys(str(terms))
    for option, value in (("steps", "100000"), ("batch_size", "2"), ("seq_len", "64")):
        _fill(browser, f"opt-training-{option}", value)
    _submit_form(browser)
    _wait(lambda: "/ui/jobs/job_" in browser.current_url, 15, "the form did not open the new job's page")
    job_page = browser.current_url
    _wait(lambda: "Training step 0 " not in _text(browser, ".progress-line") and _job_status(browser) == "running", 120,
          "the long job did not start training")
    # the job list while one job trains and another has finished, at both widths
    browser.get(f"{live_server}/ui/jobs")
    for size, suffix in ((DESKTOP, "desktop"), (PHONE, "phone")):
        _viewport(browser, size)
        browser.refresh()
        _check_no_overflow(browser, f"job list at {size[0]} px")
        _screenshot(browser, screenshots, f"jobs-{suffix}")
    _viewport(browser, DESKTOP)
    browser.get(job_page)
    button = _wait(lambda: browser.find_elements(By.CSS_SELECTOR, "button[data-action=cancel]"), 10, "no cancel button")[0]
    button.click()
    alert = _wait(lambda: _alert(browser), 5, "no confirmation asked before cancelling")
    alert.accept()
    _wait(lambda: _job_status(browser) == "cancelled", 120, "the page did not show the job cancelled")
    assert "Cancel requested" in _text(browser, "#action-status")
    job = httpx.get(f"{live_server}/jobs/{browser.current_url.rsplit('/', 1)[-1]}", headers={"Authorization": f"Bearer {api_key}"}).json()
    assert job["status"] == "cancelled" and job["request"]["terms"] == ["hypertext"] and 0 < job["progress"]["step"] < 100_000
    assert not browser.find_elements(By.CSS_SELECTOR, "button[data-action=cancel]")
    assert browser.find_elements(By.CSS_SELECTOR, "button[data-action=delete]")  # a finished job can be deleted


def _alert(driver):
    from selenium.common.exceptions import NoAlertPresentException

    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return None


def test_sign_out_ends_the_session_and_the_key_was_never_logged(browser, live_server, api_key, service_settings):
    from selenium.webdriver.common.by import By

    browser.get(f"{live_server}/ui/jobs")
    token = browser.get_cookie("tide_session")["value"]
    browser.find_element(By.CSS_SELECTOR, "form[action='/ui/logout'] button").click()
    _wait(lambda: "/ui/login" in browser.current_url, 10, "sign out did not return to the sign-in page")
    assert "signed out" in browser.page_source
    # the old cookie no longer opens anything, in the pages or the API
    stale = httpx.get(f"{live_server}/jobs", cookies={"tide_session": token})
    assert stale.status_code == 401 and stale.json()["error"]["code"] == "session_expired"
    browser.get(f"{live_server}/ui/jobs")
    assert "/ui/login" in browser.current_url
    for log in ("uvicorn.log", "worker.log"):
        assert api_key not in (service_settings.data_dir / log).read_text(errors="replace"), log
