//! The kernel's CPU list syntax (`0-3,8,10-11`), as in sysfs `cpulist`
//! files, `smp_affinity_list` and `isolcpus=`.

use std::collections::BTreeSet;

/// A set of CPU numbers.
pub type CpuSet = BTreeSet<usize>;

/// Parses `0-3,8,10-11` (also `0-7:2/4`, the stride form). The empty
/// string and sysfs's `(null)` are the empty set.
pub fn parse(text: &str) -> Result<CpuSet, String> {
    let text = text.trim();
    let mut set = CpuSet::new();
    if text.is_empty() || text == "(null)" {
        return Ok(set);
    }
    for part in text.split(',') {
        let part = part.trim();
        let bad = || format!("{part:?} in {text:?} is not a CPU number or range");
        let (range, stride) = match part.split_once(':') {
            Some((r, s)) => {
                let (used, group) = s.split_once('/').ok_or_else(bad)?;
                let used: usize = used.parse().map_err(|_| bad())?;
                let group: usize = group.parse().map_err(|_| bad())?;
                if group == 0 || used > group {
                    return Err(bad());
                }
                (r, Some((used, group)))
            }
            None => (part, None),
        };
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (
                a.parse::<usize>().map_err(|_| bad())?,
                b.parse::<usize>().map_err(|_| bad())?,
            ),
            None => {
                let n = range.parse::<usize>().map_err(|_| bad())?;
                (n, n)
            }
        };
        if lo > hi || hi > 1 << 16 {
            return Err(bad());
        }
        for cpu in lo..=hi {
            match stride {
                Some((used, group)) if (cpu - lo) % group >= used => {}
                _ => {
                    set.insert(cpu);
                }
            }
        }
    }
    Ok(set)
}

/// Formats a set the way the kernel does: `0-3,8,10-11` (empty: `""`).
pub fn format(set: &CpuSet) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = set.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end = iter.next().unwrap_or(end);
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_kernel_lists() {
        let set = parse("0-3,8,10-11\n").unwrap();
        assert_eq!(
            set.iter().copied().collect::<Vec<_>>(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(format(&set), "0-3,8,10-11");
        assert_eq!(parse("(null)").unwrap().len(), 0);
        assert_eq!(parse("").unwrap().len(), 0);
        assert_eq!(format(&parse("0-7:2/4").unwrap()), "0-1,4-5");
        assert!(parse("2-1").is_err());
        assert!(parse("x").unwrap_err().contains("\"x\""));
    }
}
