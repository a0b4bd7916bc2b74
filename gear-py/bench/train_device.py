"""The learner's device part for the end-to-end training benchmark
(``train_run.py --device cuda``): the model lives on the device and every
batch is moved there ahead of the step that uses it, as a PyTorch trainer
fed from host memory does (``DataLoader(pin_memory=True)`` and
``tensor.to(device, non_blocking=True)``).

:class:`DeviceFeed` wraps any learner feed (``next()`` -> ``(columns,
handle)``, ``update(handle, priorities)``). A background thread takes the
next host batch, copies it into a pinned staging slot, and issues the
host-to-device copy on its own CUDA stream, so batch n+1 crosses PCIe
while step n computes; the learner's stream waits on that copy's event
before using the batch. A slot is reused only after the step that read it
has finished on the device (an event recorded on the learner's stream
when it asks for the following batch), so no copy overwrites a batch the
device still reads.

On a host without CUDA (``device="cpu"``, how CI runs it) the same slot
ring, ordering and hand-back run with plain tensors and no streams: the
logic is what CI checks; the overlap is what a GPU adds.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

DEPTH = 3
"""Staging slots: one being copied, one queued, one the device reads."""


def resolve(device: str) -> torch.device:
    """``device`` as a torch device, or a clear error when it is not there."""
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"--device: {device!r} is not a torch device ({e})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no CUDA device here (torch {torch.__version__})")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: only cpu and cuda are measured")
    return dev


class Slot:
    """One staging slot: pinned host buffers and device buffers per column,
    allocated for the first batch's shapes and reused after."""

    def __init__(self) -> None:
        self.host: Dict[str, torch.Tensor] = {}
        self.device: Dict[str, torch.Tensor] = {}
        self.copied: Optional[Any] = None  # CUDA event: the copy into `device` is done
        self.released: Optional[Any] = None  # CUDA event: the step that read it is done


class DeviceFeed:
    """Batches of an inner feed, moved to ``device`` one step ahead."""

    def __init__(self, feed: Any, device: torch.device, depth: int = DEPTH) -> None:
        if depth < 2:
            raise ValueError(f"depth must be at least 2 (one copying while one is read), got {depth}")
        self.feed = feed
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.slots: List[Slot] = [Slot() for _ in range(depth)]
        self.free: "queue.Queue[int]" = queue.Queue()
        for i in range(depth):
            self.free.put(i)
        self.ready: "queue.Queue[Optional[Tuple[int, Any]]]" = queue.Queue()
        self.held: Optional[int] = None  # the slot the learner's current step reads
        self.stop = threading.Event()
        self.error: Optional[BaseException] = None
        self.copies = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def stage(self, slot: Slot, columns: Dict[str, torch.Tensor]) -> None:
        """Copies one host batch into `slot`'s device buffers."""
        for name, src in columns.items():
            dst = slot.device.get(name)
            if dst is None or dst.shape != src.shape or dst.dtype != src.dtype:
                # First batch (or a shape change): allocate this column's pair.
                slot.host[name] = torch.empty(src.shape, dtype=src.dtype, pin_memory=self.cuda)
                slot.device[name] = torch.empty(src.shape, dtype=src.dtype, device=self.device)
        if self.cuda:
            assert self.stream is not None
            with torch.cuda.stream(self.stream):
                if slot.released is not None:
                    # The step that last read this slot must be done on the device.
                    self.stream.wait_event(slot.released)
                    # Its pinned buffers are free once the last copy out of them is.
                    slot.copied.synchronize()
                for name, src in columns.items():
                    slot.host[name].copy_(src)
                    slot.device[name].copy_(slot.host[name], non_blocking=True)
                slot.copied = torch.cuda.Event()
                slot.copied.record(self.stream)
        else:
            for name, src in columns.items():
                slot.device[name].copy_(src)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    i = self.free.get(timeout=0.1)
                except queue.Empty:
                    continue
                columns, handle = self.feed.next()
                self.stage(self.slots[i], {k: v for k, v in columns.items() if isinstance(v, torch.Tensor)})
                self.copies += 1
                self.ready.put((i, handle))
        except BaseException as e:  # handed to the learner
            self.error = e
            self.ready.put(None)

    def next(self) -> Tuple[Dict[str, torch.Tensor], Any]:
        """The next batch on the device, and its handle for ``update``.
        Hands back the slot of the previous batch: the caller has finished
        its step with it (on CUDA: once the device has)."""
        if self.held is not None:
            slot = self.slots[self.held]
            if self.cuda:
                slot.released = torch.cuda.Event()
                slot.released.record(torch.cuda.current_stream(self.device))
            self.free.put(self.held)
            self.held = None
        item = self.ready.get()
        if item is None:
            raise RuntimeError(f"staging to {self.device} failed: {self.error!r}") from self.error
        i, handle = item
        slot = self.slots[i]
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(slot.copied)
        self.held = i
        return dict(slot.device), handle

    def update(self, handle: Any, priorities: Any) -> None:
        self.feed.update(handle, priorities)

    def close(self) -> None:
        """Stops the stager; call before closing the inner feed. A stager
        still inside the inner feed's ``next`` ends with that feed (a
        daemon thread), so this waits only briefly."""
        self.stop.set()
        self.free.put(0)  # wake a stager waiting for a slot
        self.thread.join(timeout=1)
