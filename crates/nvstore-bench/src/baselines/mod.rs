//! Baseline trees, each a faithful crash-consistent implementation of its
//! paper's insert, search, delete and update paths on nvstore's `pmem` layer.
