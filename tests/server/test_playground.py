"""The browser playground (GET /playground, GET / for a browser) in a real headless Chromium driven
by Selenium: it loads with no console error, a chat streams the same text as
/v1/chat/completions greedy, Stop cancels the request (no KV block held after), the adapter picker
changes the output to the adapter's, and the API key prompt works. Screenshots of each mode, on a
desktop and a narrow screen, go to $KESTREL_SCREENSHOTS (default build/playground-screenshots).
"""
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import requests

from conftest import ROOT, Server

ADAPTER = ROOT / "tests" / "data" / "lora-e2e-falcon7b-fullvocab" / "adapters" / "e1-r8-all"
SHOTS = Path(os.environ.get("KESTREL_SCREENSHOTS", ROOT / "build" / "playground-screenshots"))
MESSAGE = "Tell me about falcons"

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


def browser(width=1280, height=900):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not chromium or not driver_bin:
        pytest.skip("chromium and chromium-driver are not installed (scripts/install-deps.sh)")
    opts = Options()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={width},{height}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_bin), options=opts)


@pytest.fixture(scope="module")
def pserver():
    s = Server("--max-input-length", 256, "--max-total-tokens", 2048,
               "--adapter", f"pre={ADAPTER}")
    yield s
    assert s.stop() == 0, s.stderr()


def wait(driver, cond, timeout=60):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: cond(d))


def open_page(driver, url):
    driver.get(url + "/playground")
    wait(driver, lambda d: d.find_element(By.ID, "status").text.startswith("connected"))


def set_field(driver, field_id, value):
    el = driver.find_element(By.ID, field_id)
    el.clear()
    el.send_keys(str(value))


def send(driver, text):
    box = driver.find_element(By.ID, "input")
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()


def last_reply(driver, timeout=120):
    """The text of the last assistant (or completion) message once its stream ended."""
    def done(d):
        bodies = d.find_elements(By.CSS_SELECTOR, ".body[data-role=assistant]")
        return bodies and bodies[-1].get_attribute("data-done") == "1" and bodies[-1]
    return wait(driver, done, timeout).get_attribute("textContent")


def severe_console_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def chat_greedy(url, model="", max_tokens=12, key=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = requests.post(url + "/v1/chat/completions", headers=headers, timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": MESSAGE}],
        "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def shot(driver, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def test_page_served_to_browsers(pserver):
    r = requests.get(pserver.url + "/", headers={"Accept": "text/html"}, timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    assert "kestrel playground" in r.text and "frame-ancestors 'none'" in \
        r.headers["Content-Security-Policy"]
    assert requests.get(pserver.url + "/playground", timeout=10).status_code == 200
    assert requests.get(pserver.url + "/", timeout=10).status_code == 405  # an API client's GET
    assert "src=\"http" not in r.text and "href=\"http" not in r.text  # nothing from elsewhere


def test_chat_streams_the_greedy_text_and_screenshots(pserver):
    want = chat_greedy(pserver.url)
    for width, height, tag in ((1280, 900, "desktop"), (390, 844, "narrow")):
        d = browser(width, height)
        try:
            open_page(d, pserver.url)
            set_field(d, "temperature", 0)
            set_field(d, "max_tokens", 12)
            send(d, MESSAGE)
            assert last_reply(d) == want
            # Tokens carry their probability (colour) and alternatives (tooltip).
            toks = d.find_elements(By.CSS_SELECTOR, ".body[data-role=assistant] .tok")
            assert toks and all(t.get_attribute("data-tip").startswith("p = ") for t in toks)
            time.sleep(2.2)  # one more /metrics poll: the figures show the request
            shot(d, f"chat-{tag}")
            d.find_element(By.CSS_SELECTOR, "input[value=completion]").click()
            set_field(d, "max_tokens", 12)
            send(d, "The falcon is")
            assert last_reply(d)
            shot(d, f"completion-{tag}")
            assert severe_console_errors(d) == []
        finally:
            d.quit()


def test_stop_cancels_and_frees_blocks(pserver):
    before = pserver.metrics().get('lorax_request_failure{err="cancelled"}', 0)
    d = browser()
    try:
        open_page(d, pserver.url)
        set_field(d, "max_tokens", 1500)
        d.find_element(By.ID, "ignore-eos").click()
        send(d, MESSAGE)
        wait(d, lambda x: len(x.find_elements(By.CSS_SELECTOR, ".body[data-role=assistant] .tok")) > 3)
        d.find_element(By.ID, "stop").click()
        last_reply(d)
        n = len(d.find_elements(By.CSS_SELECTOR, ".body[data-role=assistant] .tok"))
        assert n < 1500
        deadline = time.time() + 30
        while time.time() < deadline:
            m = pserver.metrics()
            if m["lorax_request_in_flight"] == 0 and m["kestrel_kv_blocks_used"] == 0:
                break
            time.sleep(0.1)
        m = pserver.metrics()
        assert m["lorax_request_in_flight"] == 0 and m["kestrel_kv_blocks_used"] == 0
        assert m['lorax_request_failure{err="cancelled"}'] == before + 1
        assert d.find_element(By.ID, "send").is_enabled()
        assert severe_console_errors(d) == []
    finally:
        d.quit()


def test_adapter_picker_changes_the_output(pserver):
    base, lora = chat_greedy(pserver.url), chat_greedy(pserver.url, model="pre")
    assert base != lora
    d = browser()
    try:
        open_page(d, pserver.url)
        wait(d, lambda x: any(o.get_attribute("value") == "pre"
                              for o in x.find_elements(By.CSS_SELECTOR, "#model option")))
        Select(d.find_element(By.ID, "model")).select_by_value("pre")
        set_field(d, "temperature", 0)
        set_field(d, "max_tokens", 12)
        send(d, MESSAGE)
        assert last_reply(d) == lora
        # An id typed in the load field is used the same way.
        d.find_element(By.ID, "clear").click()
        set_field(d, "adapter-id", "pre")
        d.find_element(By.ID, "use-adapter").click()
        send(d, MESSAGE)
        assert last_reply(d) == lora
        assert severe_console_errors(d) == []
    finally:
        d.quit()


def test_api_key_prompt():
    s = Server("--api-key", "s3cret", "--max-input-length", 64, "--max-total-tokens", 128)
    d = browser()
    try:
        want = chat_greedy(s.url, key="s3cret")
        d.get(s.url + "/playground")  # the page itself needs no key
        alert = wait(d, lambda x: _alert(x), timeout=30)
        alert.send_keys("s3cret")
        alert.accept()
        wait(d, lambda x: x.find_element(By.ID, "status").text.startswith("connected"))
        assert d.execute_script("return sessionStorage.getItem('kestrel-api-key')") == "s3cret"
        set_field(d, "temperature", 0)
        set_field(d, "max_tokens", 12)
        send(d, MESSAGE)
        assert last_reply(d) == want
    finally:
        d.quit()
        assert s.stop() == 0


def _alert(driver):
    try:
        return driver.switch_to.alert
    except Exception:  # noqa: BLE001: no alert yet
        return False


def test_json_schema_box_constrains_the_reply(pserver):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["ok", "n"]}
    d = browser(1280, 900)
    try:
        open_page(d, pserver.url)
        set_field(d, "temperature", 1)
        set_field(d, "max_tokens", 40)
        d.find_element(By.ID, "json-schema").send_keys(json.dumps(schema))
        send(d, MESSAGE)
        reply = json.loads(last_reply(d))
        assert set(reply) == {"ok", "n"} and isinstance(reply["ok"], bool) and 0 <= reply["n"] <= 9
        shot(d, "chat-json-schema")
        # A schema that is not JSON is shown as an error, nothing is sent.
        d.find_element(By.ID, "json-schema").send_keys("{")
        send(d, MESSAGE)
        wait(d, lambda dr: "JSON schema" in dr.find_element(By.ID, "error").text)
        assert severe_console_errors(d) == []
    finally:
        d.quit()
