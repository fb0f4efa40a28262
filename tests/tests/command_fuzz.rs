//! Random command input: every command the model knows and some it does not, with random
//! op_mod, random body bytes and random input and output lengths, issued through the
//! driver's command queue. Each must complete with a status (a refusal with a syndrome);
//! none may hang or stop the model's device thread, and the device answers afterwards.
//!
//! The generator is a fixed-seed xorshift: the same commands on every run.

use uhca::cmd::{CmdError, input};
use uhca::hw::layout::cmd::{CmdStatus, Opcode};
use uhca_hw::rng::XorShift64 as Rng;
use uhca_tests::device;

/// Every opcode of `hw::layout::cmd::Opcode` but the four that end the HCA's life
/// (INIT_HCA, TEARDOWN_HCA, ENABLE_HCA, DISABLE_HCA: [`the_life_cycle_commands`] takes
/// them), and three the model does not know.
const OPCODES: [u16; 56] = [
    0x100, 0x101, 0x107, 0x108, 0x109, 0x10A, 0x10B, 0x10D, 0x200, 0x201, 0x202, 0x203, 0x205,
    0x206, 0x207, 0x301, 0x302, 0x303, 0x304, 0x400, 0x401, 0x402, 0x403, 0x500, 0x501, 0x502,
    0x503, 0x504, 0x505, 0x506, 0x507, 0x50A, 0x50B, 0x50E, 0x750, 0x754, 0x755, 0x760, 0x761,
    0x762, 0x764, 0x765, 0x770, 0x800, 0x801, 0x802, 0x803, 0x805, 0x80D, 0x816, 0x817, 0xA00,
    0xA03, 0xA08, 0xA0A, 0x7FF,
];

/// A random input for `opcode`: op_mod small (most commands take 0-2) or any, a body of
/// random bytes, mostly zero (so that more inputs get past the first check), of 16 to
/// 1,024 bytes (inline, or a mailbox chain).
fn random_input(rng: &mut Rng, opcode: u16) -> Vec<u8> {
    let op_mod = if rng.below(4) == 0 {
        rng.next() as u16
    } else {
        rng.below(3) as u16
    };
    let len = 16 + rng.below(1009) as usize;
    let mut buf = input(Opcode::from(opcode), op_mod, len);
    let density = rng.below(4);
    for b in &mut buf[8..] {
        if rng.below(4) < density {
            *b = rng.next() as u8;
        }
    }
    buf
}

/// Runs `n` random commands drawn from `opcodes`; returns how many were refused.
fn run(dev: &uhca::Device, rng: &mut Rng, opcodes: &[u16], n: usize) -> usize {
    let mut refused = 0;
    for i in 0..n {
        let opcode = opcodes[rng.below(opcodes.len() as u64) as usize];
        let inp = random_input(rng, opcode);
        let out_len = 16 + rng.below(4097) as usize;
        match dev.exec(&inp, out_len) {
            Ok(out) => assert_eq!(out.len(), out_len, "#{i} {opcode:#x}"),
            Err(CmdError::Failed {
                status, syndrome, ..
            }) => {
                assert_ne!(status, CmdStatus::Ok, "#{i} {opcode:#x}");
                assert_ne!(
                    syndrome, 0,
                    "#{i} {opcode:#x}: {status:?} without a syndrome"
                );
                refused += 1;
            }
            Err(e) => panic!("#{i} {opcode:#x} {:02x?}: {e}", &inp[..16]),
        }
    }
    refused
}

#[test]
fn random_commands_complete_with_a_status() {
    let (dev, model) = device();
    let before = model.hca().stats().commands_done;
    let mut rng = Rng::new(0x5EED_C0DE_1234_5678);
    let n = 3000;
    let refused = run(&dev, &mut rng, &OPCODES, n);
    // Most random inputs are refused, but not all: some queries and allocations pass.
    assert!(refused > n / 2 && refused < n, "{refused} of {n} refused");
    // The device thread answered every one, and still answers.
    let done = model.hca().stats().commands_done - before;
    assert!(done >= n as u64, "{done} of {n} completed");
    let (issi, _) = uhca::cmd::ops::query_issi(dev.cmd()).expect("the device still answers");
    assert!(issi <= 1);
}

/// INIT_HCA, TEARDOWN_HCA, ENABLE_HCA and DISABLE_HCA among the others: the HCA may end up
/// torn down or disabled, and every command still completes with a status.
#[test]
fn the_life_cycle_commands() {
    let (dev, model) = device();
    let mut rng = Rng::new(0xD1E5_A11F_0000_0001);
    let mut opcodes = OPCODES.to_vec();
    opcodes.extend([0x102, 0x103, 0x104, 0x105]);
    let before = model.hca().stats().commands_done;
    run(&dev, &mut rng, &opcodes, 1000);
    assert!(model.hca().stats().commands_done - before >= 1000);
    match uhca::cmd::ops::query_issi(dev.cmd()) {
        Ok(_) | Err(CmdError::Failed { .. }) => {}
        Err(e) => panic!("QUERY_ISSI after the life-cycle commands: {e}"),
    }
}
