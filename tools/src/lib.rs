//! Shared code of the uhca tools. [`perf`] is the engine behind `uhca-perf`.

#![deny(unsafe_code)]

pub mod perf;
