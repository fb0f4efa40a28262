//! Examples of the uhca driver, each a program that runs on the built-in model HCA:
//!
//! - `rdma_write`: RDMA WRITE, then RDMA READ back, between two QPs (loopback).
//! - `send_recv`: SEND with immediate data, an inline SEND, and the receives they consume.
//! - `dm_semaphore`: fetch-and-add on a semaphore in device memory (MEMIC).
//! - `peer_memory`: RDMA WRITE into a model GPU's BAR through a dma-buf, revocation,
//!   re-registration.
//!
//! Run one with `cargo run --release -p uhca-examples --example rdma_write`. Each `main` is
//! also a smoke test (`cargo test --release -p uhca-examples`, `tests/examples.rs`). This
//! library itself is empty: it only gives the package a target besides its examples.
