//! # gear-rdma
//!
//! Will hold the RDMA transport: one-sided READs of remote shards' registered
//! table regions (InfiniBand/RoCE through rdma-core via the `sideway` crate,
//! which loads libibverbs at run time), implementing `gear_core::Transport`.
//!
//! Nothing is implemented yet, so this crate deliberately exposes no items:
//! no type here pretends to move bytes. The trait it will implement, and the
//! bounds check every transport runs before posting reads
//! (`gear_core::transport::check_read_ops`), are in gear-core.
