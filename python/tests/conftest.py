"""Fixtures: a real redis-server with the redis-mem module on a free loopback
port, started once per test session and killed at teardown."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import redis

HERE = os.path.dirname(os.path.abspath(__file__))
PY_ROOT = os.path.dirname(HERE)  # python/ (the distribution; installed, not put on sys.path)
REPO_ROOT = os.path.normpath(os.path.join(PY_ROOT, ".."))

DEFAULT_MODULE = os.path.join(REPO_ROOT, "target", "release", "libredis_mem.so")

# (protocol, decode_responses): every way a redis-py user may connect.
CONNECTIONS = [(2, True), (2, False), (3, True), (3, False)]
CONNECTION_IDS = ["resp2-str", "resp2-bytes", "resp3-str", "resp3-bytes"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, port: int, proc: subprocess.Popen, logfile: str, argv=None):
        self.port = port
        self.proc = proc
        self.logfile = logfile
        self.argv = argv
        self.url = f"redis://127.0.0.1:{port}/0"

    def stop(self) -> None:
        """SIGTERM and wait (the server saves nothing: --save '')."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def start_again(self) -> None:
        """Starts the server again on the same port (after stop())."""
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_ready(self.port, self.proc)

    def client(self, protocol: int = 2, decode_responses: bool = True, **kw) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            protocol=protocol,
            decode_responses=decode_responses,
            **{"socket_timeout": 30, **kw},
        )


def _wait_ready(port: int, proc: subprocess.Popen) -> bool:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping():
                return True
        except redis.ConnectionError:
            time.sleep(0.05)
    return False


def module_path() -> str:
    module = os.path.abspath(os.environ.get("REDIS_MEM_MODULE", DEFAULT_MODULE))
    if not os.path.isfile(module):
        pytest.fail(f"module not found at {module}: build it (cargo build --release) "
                    "or set REDIS_MEM_MODULE")
    return module


def start_server(workdir: str, extra=()) -> Server:
    """A redis-server with the module on a free loopback port."""
    return _start(module_path(), workdir, list(extra))


def _start(module: str, workdir: str, extra=()) -> Server:
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        pytest.fail("redis-server not found (install redis-server or set REDIS_SERVER)")
    last_error = ""
    for _attempt in range(5):
        port = _free_port()
        logfile = os.path.join(workdir, f"redis-{port}.log")
        argv = [
                binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--loadmodule", module,
                "--save", "",
                "--appendonly", "no",
                "--dir", workdir,
                "--logfile", logfile,
                "--daemonize", "no",
                # DEBUG SLEEP: a server stall, to time a client out.
                "--enable-debug-command", "yes",
                *extra,
        ]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if _wait_ready(port, proc):
            return Server(port, proc, logfile, argv)
        proc.kill()
        proc.wait(timeout=10)
        try:
            with open(logfile) as f:
                last_error = f.read()[-2000:]
        except OSError:
            last_error = "(no log)"
    pytest.fail(f"redis-server with the module did not start:\n{last_error}")


@pytest.fixture(scope="session")
def server():
    module = module_path()
    workdir = tempfile.mkdtemp(prefix="redis-mem-pytest-")
    srv = _start(module, workdir)
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def own_server(tmp_path):
    """A server of this test's own (to stop and start again), removed after."""
    servers = []

    def make(*extra):
        srv = start_server(str(tmp_path), extra)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def clean(server):
    """An empty database with notifications off, before each test."""
    r = server.client()
    r.flushall()
    r.config_set("notify-keyspace-events", "")
    yield server
    r.close()


@pytest.fixture(params=CONNECTIONS, ids=CONNECTION_IDS)
def conn(request, clean):
    """A redis-py connection in each protocol/decoding combination."""
    protocol, decode = request.param
    r = clean.client(protocol=protocol, decode_responses=decode)
    yield r
    r.close()


@pytest.fixture
def r(clean):
    """A plain RESP2, decoded connection."""
    c = clean.client()
    yield c
    c.close()
