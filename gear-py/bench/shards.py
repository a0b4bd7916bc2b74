"""`gear serve` shard servers on loopback for the benchmarks (bench.py,
train_run.py): start one from its config file and learn the address it
listens on."""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Optional, Tuple


def start_shard(binary: str, config: str, token: str) -> Tuple[subprocess.Popen, Optional[str]]:
    """Starts ``gear serve --config config`` with ``token``; returns the
    process and the gRPC address it printed (None if it exited before
    printing one). Its later output is drained so that it never blocks on
    a full pipe."""
    # GEAR_EXIT_WITH_PARENT: the shard stops (removing its table) if this
    # process dies, even by SIGKILL, instead of serving on orphaned.
    p = subprocess.Popen([binary, "serve", "--config", config], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True,
                         env=dict(os.environ, GEAR_TOKEN=token, GEAR_EXIT_WITH_PARENT="1"))
    addr = None
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("grpc listening on "):
            addr = line.split()[3]
            break
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    return p, addr
