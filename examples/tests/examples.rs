//! The examples double as smoke tests: each one's `main` runs here on the model HCA.

#[path = "../dm_semaphore.rs"]
mod dm_semaphore;
#[path = "../rdma_write.rs"]
mod rdma_write;
#[path = "../send_recv.rs"]
mod send_recv;

#[test]
fn example_rdma_write() {
    rdma_write::main().unwrap();
}

#[test]
fn example_send_recv() {
    send_recv::main().unwrap();
}

#[test]
fn example_dm_semaphore() {
    dm_semaphore::main().unwrap();
}

#[path = "../peer_memory.rs"]
mod peer_memory;

#[test]
fn example_peer_memory() {
    peer_memory::main().unwrap();
}
