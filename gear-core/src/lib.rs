//! # gear-core
//!
//! The vocabulary every GEAR-rs crate shares, with no backend in it:
//!
//! * [`TableSpec`]/[`ColumnSpec`]/[`DType`]: what a table stores, validated
//!   with checked 64-bit arithmetic;
//! * [`Layout`]: where each byte lives (SPEC.md's columnar slot layout);
//! * [`WindowSpec`]: which steps of a trajectory land where in a batch row;
//! * [`SlotRecord`]/[`SlotKey`]: per-slot metadata as atomics, with a seqlock
//!   so readers detect slots reused under them;
//! * [`ItemRecord`]: items, windows of a stored trajectory with priorities
//!   of their own, valid only while their slot holds that trajectory;
//! * [`TableRegion`]: a table's header, slot records and data inside any
//!   [`MemoryRegion`];
//! * the backend traits: [`MemoryRegion`], [`Selector`], [`Collector`],
//!   [`Transport`] and [`TransportServer`] (remote reads: registered local
//!   buffers, posts that return a [`Ticket`], waits with a deadline, and
//!   per-transport connection data in [`RemoteRegion`]), and [`DeviceApi`]
//!   with [`Device`] (a GPU-like device: streams, events, buffers, kernel
//!   launches; the ordering rules every implementation follows).
//!
//! Architecture invariant: gear-core depends on no workspace crate and on no
//! foreign library beyond `thiserror`, and `libc` on Linux for the one
//! memory hint of [`hint::advise_huge_pages`]; it knows nothing of CUDA,
//! RDMA, files or threads.

#![warn(missing_docs)]

pub mod collect;
pub mod control;
pub mod copy;
pub mod device;
pub mod dtype;
pub mod error;
pub mod hint;
pub mod item;
pub mod layout;
pub mod memory;
pub mod region;
pub mod rng;
pub mod select;
pub mod slot;
pub mod spec;
pub mod sync;
pub mod transport;
pub mod window;

pub use collect::{BatchLayout, Collector, GatherRow};
pub use control::{
    log_entries, target, Change, ControlBlock, ListedWait, LogEntry, LogOp, WaitEntry, WaitReason, WaitRole,
    MAX_LEASES, MAX_WAITS, MIN_LOG_ENTRIES,
};
pub use device::{Access, Device, DeviceApi, DeviceBuffer, Indirect, KernelArg, Launch};
pub use dtype::{as_bytes, from_bytes, DType, Element};
pub use error::{Error, Result};
pub use item::{item_index, ItemMeta, ItemPattern, ItemRecord, ItemState, ItemWindow};
pub use layout::Layout;
pub use memory::{HeapRegion, MemoryKind, MemoryRegion};
pub use region::{RegionLayout, TableRegion, TableView};
pub use rng::{RandomSource, Xoshiro256};
pub use select::{
    all_priorities_valid, check_batch_priorities, check_priority, insert_batch_ignoring_priorities, Sampled,
    SelectionMass, SelectionRule, Selector,
};
pub use slot::{SlotKey, SlotMeta, SlotRecord, SlotState, ITEM_KEY_BIT};
pub use spec::{ColumnSpec, TableSpec};
pub use transport::{
    check_read_ops, ExposedRegion, LocalBuffer, PeerEndpoint, PendingConnection, QueuePairEndpoint, RdmaEndpoint,
    ReadOp, RemoteAccess, RemoteHandle, RemoteRegion, TcpEndpoint, Ticket, Transport, TransportKind, TransportServer,
};
pub use window::{Pad, ResolvedWindow, WindowSpec};
