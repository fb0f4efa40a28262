//! EQ context (prm-subset.md §7.1).

use crate::layout;

layout! {
    /// `eqc` (64 bytes), prm-subset.md.
    pub struct Eqc, "eqc", size 64;
    status, set_status: 0x000 [31:28],
    ec, set_ec: 0x000 [18:18],
    oi, set_oi: 0x000 [17:17],
    st, set_st: 0x000 [11:8],
    page_offset, set_page_offset: 0x008 [11:6],
    log_eq_size, set_log_eq_size: 0x00c [28:24],
    uar_page, set_uar_page: 0x00c [23:0],
    intr, set_intr: 0x014 [11:0],
    log_page_size, set_log_page_size: 0x018 [28:24],
    consumer_counter, set_consumer_counter: 0x028 [23:0],
    producer_counter, set_producer_counter: 0x02c [23:0],
}
