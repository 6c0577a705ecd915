//! Builds the interposer, `malloc_count.c`, as a shared object for
//! LD_PRELOAD: the `cc` crate picks the C compiler and flags for the
//! target (it builds static archives only, so the link is ours).

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "malloc_count.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = out_dir.join("libpinpoll_malloc_count.so");
    let compiler = cc::Build::new()
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args(["-shared", "-fPIC", "-o"])
        .arg(&object)
        .arg(SOURCE)
        .arg("-ldl");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler ({cmd:?}): {e}"));
    assert!(status.success(), "building {SOURCE} failed: {cmd:?}");
    println!(
        "cargo:rustc-env=PINPOLL_MALLOC_COUNT_SO={}",
        object.display()
    );
}
