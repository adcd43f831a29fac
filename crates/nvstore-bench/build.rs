//! Link search path for the `rocksdb` feature: the system's librocksdb is
//! found on the default linker path; `ROCKSDB_LIB_DIR` (the variable
//! `librocksdb-sys` uses too) points at another directory.

fn main() {
    println!("cargo:rerun-if-env-changed=ROCKSDB_LIB_DIR");
    if std::env::var_os("CARGO_FEATURE_ROCKSDB").is_some() {
        if let Some(dir) = std::env::var_os("ROCKSDB_LIB_DIR") {
            println!("cargo:rustc-link-search=native={}", dir.to_string_lossy());
        }
    }
}
