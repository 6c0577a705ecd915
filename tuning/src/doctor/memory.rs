//! Memory checks: huge page pools, the locked-memory limit, transparent
//! huge pages.

use pinpoll::{EngineConfig, PageSize};
use serde_json::{json, Value};

use super::{Finding, Inputs};
use crate::root::{ReadError, SystemRoot};

/// One huge page pool (`/sys/kernel/mm/hugepages/hugepages-<size>kB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugePool {
    /// `nr_hugepages`: reserved in the pool.
    pub total: u64,
    /// `free_hugepages`: not backing any mapping yet.
    pub free: u64,
    /// `resv_hugepages`: free but promised to mappings already made.
    pub reserved: u64,
    /// `surplus_hugepages`: overcommitted beyond nr_hugepages.
    pub surplus: u64,
}

impl HugePool {
    /// Pages a new mapping can still get.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved)
    }
}

/// The sysfs directory of a pool.
pub fn pool_dir(page: PageSize) -> &'static str {
    match page {
        PageSize::Huge1G => "/sys/kernel/mm/hugepages/hugepages-1048576kB",
        _ => "/sys/kernel/mm/hugepages/hugepages-2048kB",
    }
}

fn page_label(page: PageSize) -> &'static str {
    match page {
        PageSize::Huge1G => "1 GiB",
        PageSize::Huge2M => "2 MiB",
        PageSize::Base => "base",
    }
}

/// A pool's counters; `Ok(None)` when this kernel has no pool of that size.
pub fn read_pool(root: &SystemRoot, page: PageSize) -> Result<Option<HugePool>, ReadError> {
    let dir = pool_dir(page);
    if !root.exists(dir) {
        return Ok(None);
    }
    let get = |f: &str| root.read_u64(&format!("{dir}/{f}"));
    Ok(Some(HugePool {
        total: get("nr_hugepages")?,
        free: get("free_hugepages")?,
        reserved: get("resv_hugepages")?,
        surplus: get("surplus_hugepages")?,
    }))
}

/// Bytes one connection registers (and so locks): the send, RDMA-target
/// and READ rings of `slot_count` slots and the receive ring of
/// `recv_queue_depth` slots, all `slot_size` bytes — what
/// `pinpoll::datapath` checks against the memlock limit.
pub fn pinned_bytes(cfg: &EngineConfig) -> u64 {
    cfg.registered_bytes()
}

/// Huge pages of `page` size one connection maps: each of the four rings is
/// its own mapping, rounded up to whole pages. 0 when the profile does not
/// use that size.
pub fn pages_needed(cfg: &EngineConfig, page: PageSize) -> u64 {
    if cfg.pages != page || page == PageSize::Base {
        return 0;
    }
    let bytes = page.bytes() as u64;
    cfg.ring_bytes()
        .iter()
        .map(|ring| ring.div_ceil(bytes))
        .sum()
}

pub fn check_hugepages(inputs: &Inputs<'_>) -> Vec<Finding> {
    [
        ("hugepages.2M", PageSize::Huge2M),
        ("hugepages.1G", PageSize::Huge1G),
    ]
    .into_iter()
    .map(|(check, page)| check_pool(inputs, check, page))
    .collect()
}

fn check_pool(inputs: &Inputs<'_>, check: &'static str, page: PageSize) -> Finding {
    let dir = pool_dir(page);
    let label = page_label(page);
    let need = pages_needed(inputs.config, page);
    let profile = inputs.profile_label();
    let key = if page == PageSize::Huge1G { "1G" } else { "2M" };
    let persist = |n: u64| {
        match page {
        PageSize::Huge1G => format!("1 GiB pages are best reserved at boot, before memory fragments: add `hugepagesz=1G hugepages={n}` to the kernel command line"),
        _ => format!("to keep it across reboots: `vm.nr_hugepages = {n}` in /etc/sysctl.d/80-hugepages.conf, or `hugepagesz=2M hugepages={n}` on the kernel command line"),
    }
    };
    let pool = match read_pool(inputs.root, page) {
        Ok(p) => p,
        Err(e) => return Finding::unreadable(check, e),
    };
    let Some(pool) = pool else {
        let finding = format!("this kernel has no {label} huge pages (no {dir})");
        return if need > 0 {
            Finding::fail(
                check,
                format!("{finding}, but {profile} asks for hugepages = \"{key}\""),
                format!("set hugepages = \"none\" (or \"2M\") in the profile; {label} pages need CPU support (pdpe1gb) and a kernel with hugetlbfs"),
            )
        } else {
            Finding::ok(check, format!("{finding}; {profile} does not use them"))
        };
    };
    let counts = format!(
        "{} reserved, {} free, {} promised to mappings, {} surplus",
        pool.total, pool.free, pool.reserved, pool.surplus
    );
    let grow = |to: u64| format!("`echo {to} > {dir}/nr_hugepages`; {}", persist(to));
    if need > 0 {
        if pool.available() >= need {
            return Finding::ok(
                check,
                format!(
                    "{counts}; {profile} maps {need} per connection: room for {}",
                    pool.available() / need
                ),
            );
        }
        let to = pool.total + (need - pool.available());
        return Finding::fail(
            check,
            format!(
                "{counts}; {profile} maps {need} {label} page(s) per connection and only {} can be had",
                pool.available()
            ),
            grow(to),
        );
    }
    if pool.total == 0 && page == PageSize::Huge2M {
        return Finding::warn(
            check,
            format!("{counts}: profiles with hugepages = \"2M\" cannot run (huge pages cut TLB and NIC address-translation misses)"),
            grow(256),
        );
    }
    Finding::ok(
        check,
        format!("{counts}; {profile} does not map {label} pages"),
    )
}

/// `Max locked memory` of `/proc/self/limits`: the soft limit in bytes,
/// `None` = unlimited.
pub(crate) fn parse_memlock(limits: &str) -> Result<Option<u64>, String> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .ok_or("no \"Max locked memory\" line")?;
    let soft = line["Max locked memory".len()..]
        .split_whitespace()
        .next()
        .ok_or("an empty \"Max locked memory\" line")?;
    if soft == "unlimited" {
        return Ok(None);
    }
    soft.parse()
        .map(Some)
        .map_err(|_| format!("soft limit {soft:?} is not a number"))
}

/// CAP_IPC_LOCK in `CapEff` of `/proc/self/status`: exempt from the limit.
pub(crate) fn has_ipc_lock(status: &str) -> Result<bool, String> {
    const CAP_IPC_LOCK: u32 = 14;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or("no CapEff line")?
        .trim();
    let caps = u64::from_str_radix(hex, 16).map_err(|_| format!("CapEff {hex:?} is not hex"))?;
    Ok(caps & (1 << CAP_IPC_LOCK) != 0)
}

pub(super) fn human(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

pub fn check_memlock(inputs: &Inputs<'_>) -> Finding {
    const CHECK: &str = "memlock";
    const FIX: &str = "raise the locked-memory limit of the user or service that runs pinpoll: `ulimit -l unlimited` in its shell, `<user> - memlock unlimited` in /etc/security/limits.conf (new login), or LimitMEMLOCK=infinity in its systemd unit";
    let need = pinned_bytes(inputs.config);
    let profile = inputs.profile_label();
    let limit = match inputs.root.read("/proc/self/limits") {
        Ok(text) => match parse_memlock(&text) {
            Ok(l) => l,
            Err(e) => {
                return Finding::unreadable(CHECK, format!("cannot read /proc/self/limits: {e}"))
            }
        },
        Err(e) => return Finding::unreadable(CHECK, e),
    };
    let Some(limit) = limit else {
        return Finding::ok(
            CHECK,
            format!(
                "ulimit -l: unlimited ({profile} locks {} per connection)",
                human(need)
            ),
        );
    };
    let exempt = match inputs.root.read("/proc/self/status") {
        Ok(text) => has_ipc_lock(&text).unwrap_or(false),
        Err(_) => false,
    };
    let finding = format!(
        "ulimit -l: {} (of this process; {profile} locks {} per connection)",
        human(limit),
        human(need)
    );
    if exempt {
        return Finding::ok(CHECK, format!("{finding}; this process has CAP_IPC_LOCK (root), which the limit does not bind — a non-root user gets the limit"));
    }
    if limit < need {
        return Finding::fail(
            CHECK,
            format!("{finding}: not even one connection can register its rings"),
            FIX,
        );
    }
    Finding::ok(
        CHECK,
        format!("{finding}: room for {} connection(s)", limit / need.max(1)),
    )
}

/// The bracketed choice of a THP setting (`always [madvise] never`).
fn chosen(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = text[start..].find(']')? + start;
    Some(&text[start..end])
}

pub fn check_thp(inputs: &Inputs<'_>) -> Finding {
    const CHECK: &str = "mm.thp";
    const DIR: &str = "/sys/kernel/mm/transparent_hugepage";
    if !inputs.root.exists(DIR) {
        return Finding::ok(
            CHECK,
            format!("no {DIR}: this kernel has no transparent huge pages"),
        );
    }
    let read = |f: &str| -> Result<String, String> {
        let text = inputs
            .root
            .read_trim(&format!("{DIR}/{f}"))
            .map_err(|e| e.to_string())?;
        chosen(&text)
            .map(str::to_owned)
            .ok_or_else(|| format!("cannot read {DIR}/{f}: no [choice] in {text:?}"))
    };
    let enabled = match read("enabled") {
        Ok(v) => v,
        Err(e) => return Finding::unreadable(CHECK, e),
    };
    let defrag = match read("defrag") {
        Ok(v) => v,
        Err(e) => return Finding::unreadable(CHECK, e),
    };
    let finding = format!("enabled [{enabled}], defrag [{defrag}]");
    let mut fixes = Vec::new();
    if enabled == "always" {
        fixes.push(format!("`echo madvise > {DIR}/enabled`"));
    }
    if defrag == "always" {
        fixes.push(format!("`echo defer+madvise > {DIR}/defrag`"));
    }
    if fixes.is_empty() {
        return Finding::ok(CHECK, finding);
    }
    Finding::warn(
        CHECK,
        format!("{finding}: khugepaged and direct compaction stall threads at random (pinpoll maps its rings itself and does not need THP)"),
        format!(
            "{} (at boot: transparent_hugepage=madvise)",
            fixes.join(" and ")
        ),
    )
}

pub fn hugepage_facts(inputs: &Inputs<'_>) -> Value {
    let one = |page| match read_pool(inputs.root, page) {
        Ok(Some(p)) => json!({
            "total": p.total,
            "free": p.free,
            "reserved": p.reserved,
            "surplus": p.surplus,
            "needed_per_connection": pages_needed(inputs.config, page),
        }),
        Ok(None) => Value::Null,
        Err(e) => json!({ "error": e.to_string() }),
    };
    json!({ "2M": one(PageSize::Huge2M), "1G": one(PageSize::Huge1G) })
}

pub fn memlock_facts(inputs: &Inputs<'_>) -> Value {
    let limit = match inputs.root.read("/proc/self/limits") {
        Ok(t) => match parse_memlock(&t) {
            Ok(Some(n)) => json!(n),
            Ok(None) => json!("unlimited"),
            Err(e) => json!({ "error": e }),
        },
        Err(e) => json!({ "error": e.to_string() }),
    };
    let cap = inputs
        .root
        .read("/proc/self/status")
        .ok()
        .and_then(|t| has_ipc_lock(&t).ok());
    json!({
        "limit": limit,
        "cap_ipc_lock": cap,
        "needed_per_connection": pinned_bytes(inputs.config),
    })
}
