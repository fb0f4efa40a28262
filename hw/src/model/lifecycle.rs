//! The HCA's lifecycle state machine (prm-subset.md §4).

/// HCA lifecycle (prm-subset.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    /// Power-on / after DISABLE_HCA or FLR: only ENABLE_HCA (and NOP) are accepted.
    Disabled,
    /// After ENABLE_HCA: ISSI, pages, capabilities, INIT_HCA.
    Enabled,
    /// After INIT_HCA: resources.
    Initialized,
    /// After TEARDOWN_HCA: page reclaim and DISABLE_HCA.
    TornDown,
}

impl Lifecycle {
    /// Bit of this state in a `StateMask`.
    pub(crate) const fn bit(self) -> u8 {
        match self {
            Lifecycle::Disabled => 1,
            Lifecycle::Enabled => 2,
            Lifecycle::Initialized => 4,
            Lifecycle::TornDown => 8,
        }
    }
}
