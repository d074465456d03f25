//! Attributes of `/`: the daemon-wide data memory budget.

use super::*;

/// Attributes of `/`: the daemon-wide data memory budget.
pub(super) const ROOT_ATTRS: &[AttrDef] = &[
    AttrDef {
        name: "data_memory_mb",
        desc: "MiB all commands' data buffers may hold at once, 64..1073741824; empty or \"default\": an eighth of the memory, between 256 MiB and 4 GiB",
    },
    AttrDef {
        name: "data_memory",
        desc: "data memory budget: limit, used and peak in bytes, holders (sessions holding buffers), waiting and waits (commands) (read-only)",
    },
];

pub(super) fn fmt_data_memory(m: &DataMemoryStats) -> String {
    format!(
        "limit {}\nused {}\npeak {}\nholders {}\nwaiting {}\nwaits {}",
        m.limit, m.used, m.peak, m.holders, m.waiting, m.waits
    )
}

/// A value written to `/data_memory_mb`: MiB in [`DATA_MEMORY_MB`], or
/// `None` (empty or `default`) for the default.
pub(super) fn parse_data_memory_mb(s: &str) -> Result<Option<u64>, String> {
    if s.is_empty() || s.eq_ignore_ascii_case("default") {
        return Ok(None);
    }
    let valid = format!(
        "valid: {}..{} (MiB), or empty or \"default\" for the default",
        DATA_MEMORY_MB.start(),
        DATA_MEMORY_MB.end()
    );
    match s.parse::<u64>() {
        Ok(mb) if DATA_MEMORY_MB.contains(&mb) => Ok(Some(mb)),
        Ok(mb) => Err(format!("{mb} MiB is out of range; {valid}")),
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => {
            Err(format!("{s} MiB is out of range; {valid}"))
        }
        Err(_) => Err(format!("{s:?} is not a number; {valid}")),
    }
}
