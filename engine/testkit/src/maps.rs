//! Which addresses this process has mapped, read from `/proc/self/maps`:
//! how a test sees that memory a queued request names was not unmapped.

/// Whether `addr` lies in a mapping of this process.
pub fn is_mapped(addr: usize) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    maps.lines().any(|line| {
        let range = line.split_whitespace().next().unwrap_or("");
        let Some((start, end)) = range.split_once('-') else {
            return false;
        };
        match (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) {
            (Ok(start), Ok(end)) => (start..end).contains(&addr),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stack_is_mapped_and_the_zero_page_is_not() {
        let here = 0u8;
        assert!(is_mapped(&here as *const u8 as usize));
        assert!(!is_mapped(0));
    }
}
