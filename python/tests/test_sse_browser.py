"""The SSE example (examples/sse_chat) in a real headless browser: Debian's
Chromium, driven through chromedriver by selenium. Two processes of the app
share one Redis with the module; the page must end with the whole reply,
each chunk once, after

- a reload mid-reply (the page resumes from the last event id it kept), and
- its server process killed mid-reply, a load balancer (a TCP proxy here)
  sending the reconnecting EventSource (``Last-Event-ID``) to the other
  process,

and the session must hold the reply once, as the assistant message."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from conftest import REPO_ROOT, _free_port
from redis_mem import RedisMemClient

APP = os.path.join(REPO_ROOT, "examples", "sse_chat", "app.py")
TOKENS = 30
DELAY = 0.1  # seconds between tokens: a reply takes ~3 s


def _example():
    spec = importlib.util.spec_from_file_location("sse_chat_app", APP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def wait_until(pred, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class AppProcess:
    def __init__(self, name: str, redis_url: str, logdir: str):
        self.name = name
        self.port = _free_port()
        self.log = open(os.path.join(logdir, f"app-{name}.log"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, APP, "--port", str(self.port), "--redis-url", redis_url, "--name", name,
             "--token-delay", str(DELAY), "--tokens", str(TOKENS)],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        wait_until(self._up, 20, f"app {name} on port {self.port}")

    def _up(self):
        if self.proc.poll() is not None:
            self.log.seek(0)
            raise AssertionError(f"app {self.name} exited: {self.log.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return json.load(r)["server"] == self.name
        except OSError:
            return False

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


class Balancer:
    """A TCP proxy standing in for a load balancer: each connection goes to
    the backend ``route(request line)`` names when it opens."""

    def __init__(self, route):
        self.route = route
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.routed: list = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        try:
            head = b""
            while b"\r\n" not in head:
                got = client.recv(65536)
                if not got:
                    client.close()
                    return
                head += got
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            port = self.route(line)
            self.routed.append((line, port))
            upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
            upstream.settimeout(None)
            upstream.sendall(head)
        except OSError:
            client.close()
            return

        def pipe(src, dst):
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
            except OSError:
                pass
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
        pipe(client, upstream)

    def close(self):
        self.closed = True
        self.sock.close()


def _browser():
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver_bin = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not (os.path.exists(chromium) and os.path.exists(driver_bin)):
        pytest.fail("the browser test needs Debian's chromium and chromium-driver "
                    "(python/run_tests.sh installs them: apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-extensions", "--window-size=1000,800"):
        opts.add_argument(arg)
    os.environ.setdefault("SE_OFFLINE", "true")  # no Selenium Manager download: Debian's driver is given
    return webdriver.Chrome(service=Service(executable_path=driver_bin), options=opts)


@pytest.fixture
def browser():
    driver = _browser()
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def apps(clean, tmp_path):
    started = []

    def start(name):
        app = AppProcess(name, clean.url, str(tmp_path))
        started.append(app)
        return app

    yield start
    for app in started:
        app.stop()


def page_state(driver):
    raw = driver.execute_script("return sessionStorage.getItem('redis-mem-sse-chat')")
    return json.loads(raw) if raw else None


def send(driver, message):
    box = driver.find_element("id", "message")
    box.clear()
    box.send_keys(message)
    driver.find_element("id", "send").click()


def stream_id(eid):
    ms, seq = eid.split("-")
    return int(ms), int(seq)


def check_reply(driver, r, session, message, state):
    """The page shows the whole reply once; the session holds it once."""
    expected = "".join(_example().fake_reply_tokens(message, TOKENS))
    assert state["done"] and not state["failed"], state
    assert driver.find_element("id", "reply").text.strip() == expected.strip()
    assert state["text"] == expected
    ids = state["ids"]
    assert len(ids) == TOKENS  # every chunk, none twice
    assert [stream_id(i) for i in ids] == sorted(stream_id(i) for i in ids) and len(set(ids)) == TOKENS
    msgs = RedisMemClient(r).get(f"mem:{{{session}}}")
    assert [(m.role, m.content) for m in msgs] == [("user", message), ("assistant", expected)]
    assert msgs[1].msgid == state["replyId"]


def test_reload_mid_reply_resumes(browser, apps, r):
    a = apps("A")
    apps("B")  # a second process on the same Redis, not used by this page
    session, message = "reload", "What survives a reload?"
    browser.get(f"http://127.0.0.1:{a.port}/?session={session}")
    send(browser, message)
    before = wait_until(lambda: (s := page_state(browser)) and len(s["ids"]) >= 8 and s, what="8 chunks")
    assert not before["done"]
    browser.refresh()  # mid-reply: the page is gone, its sessionStorage stays
    state = wait_until(lambda: (s := page_state(browser)) and (s["done"] or s["failed"]) and s,
                       what="the end of the reply")
    check_reply(browser, r, session, message, state)
    # The new page asked for what followed the last chunk it had, not from the start.
    assert len(state["connects"]) == 2 and state["connects"][0] == "0"
    resumed_after = state["connects"][1]
    assert resumed_after in state["ids"] and resumed_after != state["ids"][-1]
    assert f"after {resumed_after}" in a.output()


def test_server_killed_mid_reply_resumes_on_the_other_process(browser, apps, r):
    a, b = apps("A"), apps("B")
    # The balancer sends the chat POST (the model run) to B and everything
    # else to A, until A is gone.
    target = {"default": a.port}
    lb = Balancer(lambda line: b.port if line.startswith("POST /chat") else target["default"])
    try:
        session, message = "failover", "What survives a dead server?"
        browser.get(f"http://127.0.0.1:{lb.port}/?session={session}")
        send(browser, message)
        wait_until(lambda: (s := page_state(browser)) and len(s["ids"]) >= 8, what="8 chunks from A")
        target["default"] = b.port
        a.stop(signal.SIGKILL)  # A dies with the page's stream open
        state = wait_until(lambda: (s := page_state(browser)) and (s["done"] or s["failed"]) and s,
                           what="the end of the reply")
        check_reply(browser, r, session, message, state)
        servers = state["servers"]
        first_b = servers.index("B")
        assert first_b >= 8 and set(servers[:first_b]) == {"A"} and set(servers[first_b:]) == {"B"}
        assert state["errors"] >= 1  # the EventSource saw the drop and reconnected itself
        # B got the reconnect with the Last-Event-ID header: the last chunk A sent.
        assert f"after {state['ids'][first_b - 1]}" in b.output()
    finally:
        lb.close()
