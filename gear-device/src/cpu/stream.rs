//! The CPU device's streams: one worker thread per stream runs its queue in
//! order, asynchronously to the host, with a random pause before each
//! command (so work finishes late, as on a busy GPU, and a missing wait
//! shows in the data too, not only in the tracker's report).

use super::exec;
use super::tracker::{Actor, Clock};
use super::DeviceState;
use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What a queued command does.
pub(crate) enum Work {
    /// Copy `len` bytes to device address `dst` from staged bytes.
    CopyStaged { dst: u64, bytes: Vec<u8> },
    /// Copy `len` bytes between addresses (host memory the caller keeps,
    /// or device memory).
    Copy { dst: u64, src: u64, len: u64 },
    /// Fill `len` bytes at `dst`.
    Fill { dst: u64, len: u64, value: u8 },
    /// Run a kernel.
    Kernel(exec::KernelCall),
    /// Wait until `stream` has completed command `seq`.
    Wait { stream: Arc<StreamCore>, seq: u64 },
    /// Run a host function as the stream (at this point of its order).
    HostFn { f: Box<dyn FnOnce() + Send>, clock: Clock },
}

pub(crate) struct Command {
    pub(crate) seq: u64,
    pub(crate) work: Work,
    /// For messages: what queued it.
    pub(crate) what: String,
}

#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) commands: VecDeque<Command>,
    /// The last command queued (0: none).
    pub(crate) queued: u64,
    /// The last command completed.
    pub(crate) completed: u64,
    /// No handle is left: the worker exits once the queue is empty.
    closing: bool,
}

/// A stream's queue, shared by its handles, its worker, and streams that
/// wait on it.
pub(crate) struct StreamCore {
    /// The stream's actor index in the device's tracker.
    pub(crate) actor: usize,
    pub(crate) device_id: u64,
    pub(crate) queue: parking_lot::Mutex<Queue>,
    pub(crate) changed: parking_lot::Condvar,
}

impl StreamCore {
    /// Blocks until command `seq` has completed.
    pub(crate) fn wait_for(&self, seq: u64) {
        let mut q = self.queue.lock();
        while q.completed < seq {
            self.changed.wait(&mut q);
        }
    }

    /// Whether command `seq` has completed.
    pub(crate) fn done(&self, seq: u64) -> bool {
        self.queue.lock().completed >= seq
    }
}

/// One handle's share of a stream: the last one dropped tells the worker
/// to exit once it has drained the queue.
pub(crate) struct StreamHandle {
    pub(crate) core: Arc<StreamCore>,
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        self.core.queue.lock().closing = true;
        self.core.changed.notify_all();
    }
}

/// Starts the worker of a new stream.
pub(crate) fn spawn(device: &Arc<DeviceState>, actor: usize) -> std::io::Result<Arc<StreamHandle>> {
    let core = Arc::new(StreamCore {
        actor,
        device_id: device.id,
        queue: parking_lot::Mutex::new(Queue::default()),
        changed: parking_lot::Condvar::new(),
    });
    let worker_core = core.clone();
    let weak = Arc::downgrade(device);
    let max_delay = device.options.max_delay;
    let seed = device.options.seed ^ (actor as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    std::thread::Builder::new()
        .name(format!("gear-cpu-device-{}-stream-{actor}", device.id))
        .spawn(move || work(worker_core, weak, max_delay, seed))?;
    Ok(Arc::new(StreamHandle { core }))
}

fn work(core: Arc<StreamCore>, device: Weak<DeviceState>, max_delay: Duration, seed: u64) {
    let mut rng = seed | 1;
    loop {
        let cmd = {
            let mut q = core.queue.lock();
            loop {
                if let Some(c) = q.commands.pop_front() {
                    break c;
                }
                if q.closing {
                    return;
                }
                core.changed.wait(&mut q);
            }
        };
        if !max_delay.is_zero() {
            // xorshift64: a pause of 0 to max_delay before each command.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let ns = rng % (max_delay.as_nanos() as u64 + 1);
            std::thread::sleep(Duration::from_nanos(ns));
        }
        let seq = cmd.seq;
        if let Some(dev) = device.upgrade() {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&dev, &core, cmd)));
            if let Err(p) = outcome {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "a panic".into());
                dev.report_from_worker(format!("stream {} command {seq} panicked: {msg}", core.actor));
            }
        }
        let mut q = core.queue.lock();
        q.completed = seq;
        drop(q);
        core.changed.notify_all();
    }
}

fn run(dev: &Arc<DeviceState>, core: &StreamCore, cmd: Command) {
    match cmd.work {
        Work::CopyStaged { dst, bytes } => {
            if let Err(m) = dev.check_live(dst, bytes.len() as u64) {
                return dev.report_from_worker(format!("{}: {m}", cmd.what));
            }
            // SAFETY: `dst..dst+len` lies in a live allocation of this device
            // (checked just now; the tracker checked at enqueue that nothing
            // unordered uses it), and the staged bytes are ours.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, bytes.len()) };
        }
        Work::Copy { dst, src, len } => {
            if let Err(m) = dev.check_live(dst, len) {
                return dev.report_from_worker(format!("{}: destination: {m}", cmd.what));
            }
            if dev.is_device_memory(src) {
                if let Err(m) = dev.check_live(src, len) {
                    return dev.report_from_worker(format!("{}: source: {m}", cmd.what));
                }
            }
            // SAFETY: the destination lies in a live allocation (checked);
            // the source is device memory checked alike, or host memory the
            // caller of `upload` keeps readable until this command ran (its
            // contract). `copy` (memmove) tolerates overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        }
        Work::Fill { dst, len, value } => {
            if let Err(m) = dev.check_live(dst, len) {
                return dev.report_from_worker(format!("{}: {m}", cmd.what));
            }
            // SAFETY: checked as above.
            unsafe { std::ptr::write_bytes(dst as *mut u8, value, len as usize) };
        }
        Work::Kernel(call) => exec::run_kernel(dev, &call, &cmd.what),
        Work::Wait { stream, seq } => stream.wait_for(seq),
        Work::HostFn { f, clock } => {
            let actor = Actor::Stream { actor: core.actor, seq: cmd.seq, clock };
            super::AS_STREAM.with(|s| *s.borrow_mut() = Some((core.device_id, actor)));
            f();
            super::AS_STREAM.with(|s| *s.borrow_mut() = None);
        }
    }
}
