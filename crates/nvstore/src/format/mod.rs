//! Persistent structures, one file each. Every file opens with its byte
//! layout; `docs/format.md` collects them.

pub mod blob;
pub mod chunk;
pub mod element;
pub mod header;
pub mod leaf_isle;
pub mod leaf_nv;
pub mod saved;
pub mod validate;
