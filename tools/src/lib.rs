//! Shared code of the uhca tools. [`perf`] is the engine behind `uhca-perf`; [`reference`]
//! measures the machine figures its results are compared with (`uhca-perf cacheline|memcpy`).

#![deny(unsafe_code)]

pub mod perf;
pub mod reference;
