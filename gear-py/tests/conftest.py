"""Shared fixtures: unique shared-memory names, targets that are not
regular files, and a helper that runs a Python child process with a
deadline."""

import os
import socket
import stat
import subprocess
import sys
import uuid

import pytest


@pytest.fixture
def shm_name():
    """A fresh shared-memory table name; the file is removed afterwards if
    a test left it behind."""
    name = f"gear-py-test-{uuid.uuid4().hex[:12]}"
    yield name
    path = os.path.join("/dev/shm", name)
    if os.path.exists(path):
        os.unlink(path)


def run_child(code: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (argv[1:] = args); fails the test
    if it does not finish within `timeout` seconds."""
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


# --- three real `gear serve` processes on loopback -------------------------

import pathlib
import queue
import signal
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
TOKEN = "py-test-token-0123456789"


def gear_binary() -> str:
    """The `gear` binary: $GEAR_BIN, else the workspace's debug or release
    build. ci/pytest.sh builds it; a missing binary fails the test (a
    cluster test that skipped would prove nothing)."""
    for candidate in (os.environ.get("GEAR_BIN"), REPO / "target/debug/gear", REPO / "target/release/gear"):
        if candidate and os.path.exists(candidate):
            return str(candidate)
    pytest.fail("no `gear` binary: run `cargo build -p gear-cli` (ci/pytest.sh does) or set GEAR_BIN")


SHARD_CONFIG = """name = "{name}"
dir = "{dir}"
max_len = {max_len}
capacity = {capacity}
seed = {shard}
{columns}
[sampler]
kind = "{sampler}"
{sampler_params}
{extra}
[grpc]
listen = "{listen}"
shard = {shard}
"""


class ShardServer:
    """One `gear serve` process; `addr` is where it listens."""

    def __init__(self, config: pathlib.Path, listen: str, token: str):
        self.config, self.token = config, token
        env = dict(os.environ, GEAR_TOKEN=token)
        self.proc = subprocess.Popen(
            [gear_binary(), "serve", "--config", str(config)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )
        found: "queue.Queue[str]" = queue.Queue()

        def read() -> None:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                if line.startswith("grpc listening on "):
                    found.put(line.split()[3])

        threading.Thread(target=read, daemon=True).start()
        try:
            self.addr = found.get(timeout=30)
        except queue.Empty:
            self.kill()
            pytest.fail(f"gear serve --config {config} did not start listening")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


class LocalCluster:
    """`shards` `gear serve` processes on 127.0.0.1, tables in a temporary
    directory (not /dev/shm), killed when the test ends."""

    def __init__(self, root: pathlib.Path, shards: int = 3, *, max_len: int = 16, capacity: int = 256,
                 sampler: str = "prioritized", columns=None, extra: str = "", token: str = TOKEN):
        self.root, self.token = root, token
        self.columns = columns or [("id", "i64", ()), ("t", "i32", ()), ("obs", "u8", (48,))]
        self.params = dict(max_len=max_len, capacity=capacity, sampler=sampler, extra=extra)
        self.servers = [self._start(s, "127.0.0.1:0") for s in range(shards)]

    def _start(self, shard: int, listen: str) -> ShardServer:
        cols = "\n".join(
            f'[[columns]]\nname = "{n}"\ndtype = "{d}"' + (f"\nshape = {list(shape)}" if shape else "")
            for n, d, shape in self.columns
        )
        sampler_params = "alpha = 0.6\nbeta = 0.4" if self.params["sampler"] == "prioritized" else ""
        config = self.root / f"shard{shard}.toml"
        name = f"gear-py-{os.getpid()}-{uuid.uuid4().hex[:8]}-{shard}"
        self.table_names = getattr(self, "table_names", {})
        self.table_names[shard] = name
        config.write_text(SHARD_CONFIG.format(
            name=name, dir=self.root, shard=shard,
            columns=cols, sampler_params=sampler_params, listen=listen, **self.params,
        ))
        return ShardServer(config, listen, self.token)

    @property
    def addrs(self):
        return [s.addr for s in self.servers]

    def restart(self, shard: int) -> None:
        """Starts shard `shard` again on its address (an empty table)."""
        addr = self.servers[shard].addr
        self.servers[shard].kill()
        deadline = time.monotonic() + 20
        while True:
            try:
                self.servers[shard] = self._start(shard, addr)
                return
            except BaseException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def cluster_file(self, **extra) -> pathlib.Path:
        lines = ["shards = [" + ", ".join(f'"{a}"' for a in self.addrs) + "]"]
        lines += [f"{k} = {v}" for k, v in extra.items()]
        path = self.root / "cluster.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def close(self) -> None:
        for s in self.servers:
            s.kill()


@pytest.fixture
def local_cluster(tmp_path):
    """A factory of LocalClusters; every one is killed at the end."""
    made = []

    def make(**kwargs) -> LocalCluster:
        c = LocalCluster(tmp_path / f"c{len(made)}", **kwargs)
        made.append(c)
        return c

    for i in range(4):
        (tmp_path / f"c{i}").mkdir()
    yield make
    for c in made:
        c.close()


def require(module: str):
    """Imports an optional module (torch, jax). Where GEAR_REQUIRE_TORCH=1
    (ci/pytest.sh, so `.ci/run`) a missing one fails the test; elsewhere
    the test skips with the reason."""
    if os.environ.get("GEAR_REQUIRE_TORCH") == "1":
        import importlib

        try:
            return importlib.import_module(module)
        except ImportError as e:
            pytest.fail(f"{module} is required here (GEAR_REQUIRE_TORCH=1) but cannot be imported: {e}")
    return pytest.importorskip(module, reason=f"{module} is not installed (ci/pytest.sh installs it)")


def require_installed(module: str) -> None:
    """As `require`, without importing the module into this process."""
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        return
    if os.environ.get("GEAR_REQUIRE_TORCH") == "1":
        pytest.fail(f"{module} is required here (GEAR_REQUIRE_TORCH=1) but is not installed")
    pytest.skip(f"{module} is not installed (ci/pytest.sh installs it)")


@pytest.fixture
def not_regular_targets(tmp_path):
    """Paths a write must refuse, each with the words its error names:
    a FIFO, a directory, a socket, a symlink to a regular file, and a
    character device (a node like /dev/null made in tmp_path where this
    process may, as root, so that a regression replaces that copy and
    never the machine's; /dev/null itself where the process may not
    replace it anyway; none for root without CAP_MKNOD). Yields the
    list and the symlink's regular target (holding b"not mine"); after
    the test, checks each path is still what it was."""
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    directory = tmp_path / "a-directory"
    directory.mkdir()
    sock_path = tmp_path / "a-socket"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    kept = tmp_path / "kept"
    kept.write_bytes(b"not mine")
    link = tmp_path / "link"
    link.symlink_to(kept)
    targets = [(fifo, "is a FIFO"), (directory, "is a directory"), (sock_path, "is a socket"),
               (link, "is a symbolic link")]
    node = tmp_path / "null-device"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        node = None if os.geteuid() == 0 else "/dev/null"
    if node is not None:
        targets.append((node, "is a character device, not a regular file"))
    yield targets, kept
    sock.close()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and directory.is_dir() and link.is_symlink()
    assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    if node is not None:
        assert stat.S_ISCHR(os.lstat(node).st_mode)
