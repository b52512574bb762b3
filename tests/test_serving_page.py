"""serve.py's page (``GET /``, ``src/deploy/serve_page.py``) in headless Chromium, driven over
the Chrome DevTools Protocol (a websocket, websocket-client): two real JPEGs set on its file
input as a user's upload, the answers it shows equal to predict.py's for those files, the
Grad-CAM overlays of a checkpoint drawn, no console error; without Chromium the test skips with
the reason (fails under CI=true, where .ci/run installs it)."""
import base64
import itertools
import json
import os
import subprocess
import time

import httpx
import pytest

from tests.helpers import run_in_process, succeeded
from tests.test_report_page import CHROMIUM_FLAGS, require_chromium
from tests.test_serving import (
    ROUNDING,
    SIDE,
    TIMEOUT,
    built,
    copied_images,
    sample_images,
    saved_checkpoint,
    serving,
)


class DevTools:
    """One page of a headless Chromium, driven by Chrome DevTools Protocol commands over its
    websocket; the page's console errors and exceptions are kept in ``errors``."""

    def __init__(self, profile):
        import websocket

        self.proc = subprocess.Popen([require_chromium(), *CHROMIUM_FLAGS,
                                      "--remote-debugging-port=0", f"--user-data-dir={profile}",
                                      "--window-size=1100,900", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file, deadline = os.path.join(profile, "DevToolsActivePort"), time.time() + TIMEOUT
        while not os.path.isfile(port_file) or not open(port_file).read().strip():
            assert time.time() < deadline and self.proc.poll() is None, "chromium did not start"
            time.sleep(0.1)
        port = open(port_file).read().split()[0]
        pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json()
                 if t["type"] == "page"]
        self.socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"],
                                                  timeout=TIMEOUT, suppress_origin=True)
        self.ids, self.events, self.errors = itertools.count(1), [], []
        for domain in ("Page", "Runtime", "Log", "DOM"):
            self.call(f"{domain}.enable")

    def call(self, method, **params):
        """Send a command and return its result (events meanwhile kept)."""
        number = next(self.ids)
        self.socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == number:
                assert "error" not in message, (method, message["error"])
                return message["result"]
            self.keep(message)

    def keep(self, message):
        self.events.append(message.get("method"))
        params = message.get("params", {})
        if message.get("method") == "Runtime.exceptionThrown":
            self.errors.append(params["exceptionDetails"].get("text"))
        elif message.get("method") == "Runtime.consoleAPICalled" and params["type"] == "error":
            self.errors.append(params["args"])
        elif message.get("method") == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"]["text"])

    def evaluate(self, expression):
        return self.call("Runtime.evaluate", expression=expression,
                         returnByValue=True)["result"].get("value")

    def wait_for(self, expression):
        """Poll ``expression`` until it is truthy (``TIMEOUT`` seconds at most)."""
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"never true: {expression}")

    def close(self):
        self.socket.close()
        self.proc.terminate()
        self.proc.wait(TIMEOUT)


SHOWN = """JSON.stringify(Array.from(document.querySelectorAll('.answer')).map(box => ({
  image: box.dataset.image,
  cam: box.querySelector('img.cam') ? box.querySelector('img.cam').naturalWidth : 0,
  top: Array.from(box.querySelectorAll('tr.top-row')).map(row =>
    [Number(row.dataset.class), Number(row.dataset.probability), row.cells[0].textContent])
})))"""


@pytest.mark.slow
def test_an_upload_on_the_page_shows_predict_pys_answers_and_the_grad_cam(tmp_path):
    require_chromium()
    ckpt = saved_checkpoint(tmp_path / "r18.ckpt", 3)
    chosen = copied_images(str(tmp_path / "images"), sample_images()[:2])
    result = succeeded(run_in_process("predict.py", "--checkpoint_path", ckpt, "--image_path",
                                      os.path.dirname(chosen[0])))
    expected = {os.path.basename(line["image"]): line for line in map(
        json.loads, result.stdout.splitlines())}
    service = built("--checkpoint_path", ckpt, "--max_batch_size", "2")
    browser = DevTools(str(tmp_path / "profile"))
    try:
        with serving(service) as url:
            browser.call("Page.navigate", url=f"{url}/")
            browser.wait_for("document.readyState === 'complete' && "
                             "document.getElementById('status').textContent === 'ready'")
            browser.evaluate("document.getElementById('cam').click()")  # Grad-CAM on
            root = browser.call("DOM.getDocument")["root"]["nodeId"]
            node = browser.call("DOM.querySelector", nodeId=root, selector="#file")["nodeId"]
            browser.call("DOM.setFileInputFiles", nodeId=node,
                         files=chosen)
            browser.wait_for("document.querySelectorAll('img.cam').length === 2 && "
                             "Array.from(document.querySelectorAll('img.cam'))"
                             ".every(i => i.complete && i.naturalWidth > 0)")
            shown = json.loads(browser.evaluate(SHOWN))
            status = browser.evaluate("document.getElementById('status').textContent")
            picture = browser.call("Page.captureScreenshot", format="png")["data"]
    finally:
        browser.close()
    (tmp_path / "page.png").write_bytes(base64.b64decode(picture))
    assert status == "done: 2 answered"
    assert sorted(box["image"] for box in shown) == sorted(expected)
    for box in shown:
        line = expected[box["image"]]
        assert [k for k, _, _ in box["top"]] == [e["class"] for e in line["top"]], box
        assert [name for _, _, name in box["top"]] == [e["name"] for e in line["top"]]
        for (_, probability, _), entry in zip(box["top"], line["top"]):
            assert abs(probability - entry["probability"]) <= ROUNDING
        assert box["cam"] == SIDE  # the overlay, at the size the network saw
    assert browser.errors == [], browser.errors
