//! uhca
