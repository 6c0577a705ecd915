//! Generates the bindings from the headers of the rdma-core installed on
//! this machine, so they match the libraries the program will load.
//!
//! A current bindgen reads what every libclang from 14 to 19 reports,
//! including the anonymous unions of `<infiniband/ib_user_ioctl_verbs.h>`
//! that bindgen before 0.62 cannot name (rdma-sys issue #26). The
//! `static inline` verbs are not generated: `src/inline.rs` writes the
//! ones pinpoll calls in Rust, straight through the provider's ops table.
//!
//! Documentation builds (docs.rs sets `DOCS_RS`) have no rdma-core headers
//! and link nothing: they use `src/docs_bindings.rs`, bindings generated
//! once from Debian 12's rdma-core 44 by `scripts/check-publish.sh
//! --regenerate`. Those are never compiled into a program.

use std::env;
use std::path::PathBuf;

/// rdma-core packages by distribution family, for the error message.
const INSTALL_HINT: &str = "install the rdma-core development files: \
    `apt-get install libibverbs-dev librdmacm-dev pkg-config` (Debian, Ubuntu) or \
    `dnf install rdma-core-devel pkgconf-pkg-config` (RHEL, Fedora)";

fn probe(lib: &str, min_version: &str) -> Vec<PathBuf> {
    match pkg_config::Config::new()
        .atleast_version(min_version)
        .probe(lib)
    {
        Ok(found) => found.include_paths,
        Err(e) => {
            // No pkg-config data: link by name and use the default include
            // path, which is where distributions put these headers anyway.
            println!(
                "cargo:warning=pkg-config found no {lib} ({e}); linking -l{} by name",
                &lib[3..]
            );
            println!("cargo:rustc-link-lib={}", &lib[3..]);
            Vec::new()
        }
    }
}

/// The blocklisted socket and time types are libc's, which are plain
/// `Copy` data: unions that hold them can then be ordinary Rust unions.
#[derive(Debug)]
struct LibcTypes;

impl bindgen::callbacks::ParseCallbacks for LibcTypes {
    fn blocklisted_type_implements_trait(
        &self,
        _name: &str,
        derive: bindgen::callbacks::DeriveTrait,
    ) -> Option<bindgen::callbacks::ImplementsTrait> {
        use bindgen::callbacks::{DeriveTrait, ImplementsTrait};
        match derive {
            DeriveTrait::Copy => Some(ImplementsTrait::Yes),
            _ => Some(ImplementsTrait::No),
        }
    }
}

/// Where the generated bindings go; `src/lib.rs` includes them from there.
fn bindings_path() -> PathBuf {
    PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("bindings.rs")
}

/// A documentation-only build: the pre-generated bindings, no headers,
/// no libclang, nothing linked.
fn use_docs_bindings() {
    println!("cargo:rerun-if-changed=src/docs_bindings.rs");
    std::fs::copy("src/docs_bindings.rs", bindings_path())
        .expect("copying src/docs_bindings.rs into OUT_DIR");
    println!(
        "cargo:rustc-env=PINPOLL_VERBS_SYS_LIBCLANG=none: pre-generated bindings for documentation"
    );
}

fn main() {
    println!("cargo:rerun-if-env-changed=DOCS_RS");
    if env::var_os("DOCS_RS").is_some() {
        use_docs_bindings();
        return;
    }
    println!("cargo:rerun-if-changed=src/wrapper.h");
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");
    let mut include_paths = probe("libibverbs", "1.8");
    include_paths.extend(probe("librdmacm", "1.2"));
    include_paths.sort();
    include_paths.dedup();

    let bindings = bindgen::Builder::default()
        .header("src/wrapper.h")
        .clang_args(
            include_paths
                .iter()
                .map(|p| format!("-I{}", p.display())),
        )
        .allowlist_function("ibv_.*|rdma_.*")
        .allowlist_type("ibv_.*|rdma_.*|verbs_context|_compat_ibv_port_attr")
        .allowlist_var("IBV_.*|RDMA_.*")
        // The inline verbs are written in src/inline.rs.
        .blocklist_function(
            "ibv_post_send|ibv_post_recv|ibv_post_srq_recv|ibv_poll_cq|ibv_req_notify_cq|ibv_query_port",
        )
        // The socket and time types are libc's own, so addresses pass
        // between std, libc and librdmacm without casts between copies.
        .blocklist_type("sockaddr|sockaddr_in|sockaddr_in6|sockaddr_storage|in_addr|in6_addr|timespec|sa_family_t|in_port_t|in_addr_t|socklen_t")
        // Flag sets: newtypes with `|`, read as `.0`.
        .bitfield_enum(
            "ibv_access_flags|ibv_send_flags|ibv_wc_flags|ibv_qp_attr_mask|ibv_port_cap_flags",
        )
        // Plain enumerations: constants in a module named after the enum,
        // typed as the C enum's integer (never an invalid Rust enum).
        .constified_enum_module(
            "ibv_wr_opcode|ibv_wc_status|ibv_wc_opcode|ibv_qp_state|ibv_qp_type|ibv_mtu|\
             ibv_port_state|ibv_event_type|ibv_node_type|ibv_transport_type|\
             rdma_port_space|rdma_cm_event_type",
        )
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(false)
        .generate_comments(false)
        .size_t_is_usize(true)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .parse_callbacks(Box::new(LibcTypes))
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "generating the verbs bindings failed: {e}\n\
                 bindgen needs libclang (Debian: libclang-dev) and the headers \
                 <infiniband/verbs.h> and <rdma/rdma_cma.h>; {INSTALL_HINT}"
            )
        });

    // Which libclang read the headers: the build matrix checks it.
    println!(
        "cargo:rustc-env=PINPOLL_VERBS_SYS_LIBCLANG={}",
        bindgen::clang_version().full
    );
    bindings
        .write_to_file(bindings_path())
        .expect("writing the generated bindings into OUT_DIR");
}
