//! What the benchmarks do with their results: JSON lines to a writer or a
//! file, or a table; and how a table writes a rate.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use nvstore::{Error, Result};

/// One JSON object per line.
pub fn print_json_lines<T: Serialize>(items: &[T], out: &mut dyn Write) -> std::io::Result<()> {
    for it in items {
        serde_json::to_writer(&mut *out, it).map_err(std::io::Error::other)?;
        writeln!(out)?;
    }
    Ok(())
}

/// Operations per second, short: `1.23M`, `45.6k`, `789`.
pub(crate) fn fmt_ops(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Writes `items` as JSON lines to the file `name` in `dir` (created if
/// missing); returns the file's path.
pub fn write_out<T: Serialize>(dir: &Path, name: &str, items: &[T]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).map_err(|e| Error::io(&path, e))?;
    print_json_lines(items, &mut f).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

/// What `bench micro`, `compare` and `adaptive` do with their results:
/// prints them to `out` as JSON lines if `json`, else with `table`; then,
/// given a directory (`--out DIR`), writes them there as JSON lines to the
/// file `name()`.
pub(crate) fn print_and_save<T: Serialize>(
    rs: &[T],
    json: bool,
    table: fn(&[T], &mut dyn Write) -> std::io::Result<()>,
    out: &mut dyn Write,
    dir: Option<&Path>,
    name: impl FnOnce() -> String,
) -> Result<()> {
    let stdout_err = |e| Error::io("<stdout>", e);
    if json {
        print_json_lines(rs, out).map_err(stdout_err)?;
    } else {
        table(rs, out).map_err(stdout_err)?;
    }
    if let Some(dir) = dir {
        write_out(dir, &name(), rs)?;
    }
    Ok(())
}
