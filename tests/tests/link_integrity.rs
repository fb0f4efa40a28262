//! Frames that cross a link are verified (ICRC and headers) by the receiving model even
//! though frames on the port's internal loopback queue are trusted (`parse_trusted`): a
//! link that corrupts frames never corrupts data, it only costs retransmissions.

use std::sync::Arc;

use uhca::Device;
use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcStatus};
use uhca::hw::link::{FaultConfig, LinkConfig};
use uhca::hw::model::Hca;
use uhca::pci::model::ModelFunction;
use uhca::resource::{Access, ConnectParams, CqConfig, Mtu, QpConfig};
use uhca_tests::datapath::{read, wait_n};
use uhca_tests::{config, model_with_mac};

fn model(mac_last: u8) -> Arc<ModelFunction> {
    let mut mac = uhca::hw::model::ModelConfig::default().mac;
    mac[5] = mac_last;
    model_with_mac(mac)
}

#[test]
fn a_link_that_corrupts_frames_never_corrupts_the_data_written() {
    const LEN: usize = 16 * 1024;
    const WRITES: u64 = 6;
    let (ma, mb) = (model(0x0A), model(0x0B));
    let a = Device::open(ma.clone(), config()).expect("boot a");
    let b = Device::open(mb.clone(), config()).expect("boot b");
    let corrupting = LinkConfig {
        faults: FaultConfig {
            seed: 11,
            corrupt_one_in: 5, // one byte of one frame in five, either direction
            ..FaultConfig::default()
        },
        ..LinkConfig::default()
    };
    Hca::link_pair_with(ma.hca(), mb.hca(), corrupting).unwrap();
    let (pda, pdb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (
        a.create_cq(&CqConfig::default()).unwrap(),
        b.create_cq(&CqConfig::default()).unwrap(),
    );
    let mut cqa = cqa;
    let mut qa = a.create_qp(&pda, &cqa, &cqa, &QpConfig::default()).unwrap();
    let mut qb = b.create_qp(&pdb, &cqb, &cqb, &QpConfig::default()).unwrap();
    let (addr_a, addr_b) = (a.roce_address(0).unwrap(), b.roce_address(0).unwrap());
    // ACK timeout 4.096 us * 2^8 (about 1 ms): a lost frame is resent soon.
    let mut pa = ConnectParams::new(qb.qpn(), addr_b.gid, addr_b.mac);
    pa.mtu = Mtu::M1024;
    pa.timeout = 8;
    let mut pb = ConnectParams::new(qa.qpn(), addr_a.gid, addr_a.mac);
    pb.mtu = Mtu::M1024;
    pb.timeout = 8;
    qa.connect(&pa).unwrap();
    qb.connect(&pb).unwrap();

    let src = pda.alloc_mr(LEN, Access::ALL).unwrap();
    let dst = pdb.alloc_mr(LEN, Access::ALL).unwrap();
    for w in 0..WRITES {
        let pattern: Vec<u8> = (0..LEN)
            .map(|i| (i as u64 * 131 + w * 17 + (i as u64 >> 8)) as u8)
            .collect();
        src.write(0, &pattern).unwrap();
        dst.write(0, &vec![0xEE; LEN]).unwrap();
        let sge = [Sge::of(&src, 0, LEN).unwrap()];
        qa.post_send(&SendWr {
            wr_id: w,
            op: SendOp::Write {
                local: Local::Sges(&sge),
                remote: Remote::of(&dst, 0),
            },
            flags: SendFlags::SIGNALED,
        })
        .unwrap();
        qa.ring_doorbell();
        let c = wait_n(&mut cqa, 1);
        assert_eq!(c[0].wr_id, w);
        assert_eq!(c[0].status, WcStatus::Success, "{c:?}");
        assert!(read(&dst, 0, LEN) == pattern, "write {w}: data corrupted");
    }
    // Frames were lost to corruption (dropped by the receiver) and resent.
    let sa = ma.hca().stats();
    assert!(sa.retransmits > 0, "{sa:?}");
}
