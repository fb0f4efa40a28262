//! Shared code of the uhca tools. [`perf`] is the engine behind `uhca-perf`.

pub mod perf;
