//! Whether the workspace's malloc-counting interposer (`tests/malloc_count`,
//! a dev-dependency not published with the crate) is here: the pooled
//! zero-allocation unit test needs it, and the crate's tarball, which
//! leaves it out, builds its tests without that one.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(pinpoll_malloc_count)");
    println!("cargo::rerun-if-changed=tests/malloc_count/Cargo.toml");
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    if std::path::Path::new(&dir)
        .join("tests/malloc_count/Cargo.toml")
        .exists()
    {
        println!("cargo::rustc-cfg=pinpoll_malloc_count");
    }
}
