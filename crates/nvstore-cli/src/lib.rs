//! The library part of the `nvstore` command: the text form of records that
//! `dump`, `scan` and `load` share ([`escape`]), so it can be tested and
//! fuzzed apart from the binary.

#![deny(unsafe_code)]

pub mod escape;
