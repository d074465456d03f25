//! What the benchmark reads from `/proc`: a process's CPU time (utime +
//! stime of the whole thread group, proc(5) `/proc/PID/stat` fields 14 and
//! 15), its resident set size (`VmRSS` in `/proc/PID/status`), its command
//! name (to guard against PID reuse), and the machine's CPU model.

use std::process::Command;

/// utime + stime in clock ticks from the text of `/proc/PID/stat`.
///
/// The command name (field 2) is in parentheses and may itself contain
/// spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: field 3 (state) is f[0]; utime (14) is f[11], stime (15) f[12].
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The command name (field 2) from the text of `/proc/PID/stat`.
pub fn parse_stat_comm(stat: &str) -> Option<&str> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    (close > open).then(|| &stat[open + 1..close])
}

/// `VmRSS` in KiB from the text of `/proc/PID/status`.
pub fn parse_status_rss_kib(status: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let v = l.strip_prefix("VmRSS:")?;
        v.split_whitespace().next()?.parse().ok()
    })
}

/// Steal and total CPU time of the whole machine in clock ticks, from the
/// `cpu` line of `/proc/stat` (user nice system idle iowait irq softirq
/// steal; guest time is already counted in user).
pub fn parse_proc_stat_steal(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    (f.len() == 8).then(|| (f[7], f.iter().sum()))
}

/// The share (percent) of the machine's CPU time the hypervisor took
/// between two [`machine_steal`] readings.
pub fn steal_pct(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<f64> {
    let ((s0, t0), (s1, t1)) = (before?, after?);
    let total = t1.checked_sub(t0)?;
    (total > 0).then(|| s1.saturating_sub(s0) as f64 * 100.0 / total as f64)
}

/// [`parse_proc_stat_steal`] of this machine now.
pub fn machine_steal() -> Option<(u64, u64)> {
    parse_proc_stat_steal(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The first `model name` of `/proc/cpuinfo`.
pub fn parse_cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name").then(|| v.trim().to_string())
    })
}

/// CPU time of process `pid` in clock ticks, `None` if it is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    parse_stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Resident set size of `pid` in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    parse_status_rss_kib(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// Command name of `pid`.
pub fn comm(pid: u32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_comm(&s).map(str::to_string)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux
/// architecture in practice when getconf is missing).
pub fn clk_tck() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (tgtd) S 1 4242 4242 0 -1 4194624 3043 0 0 0 \
        1234 567 0 0 20 0 3 0 81234 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn steal_from_proc_stat() {
        let a = "cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 50 0 25 400 5 0 0 20 0 0\n";
        let b = "cpu  150 0 70 900 10 0 0 70 0 0\n";
        assert_eq!(parse_proc_stat_steal(a), Some((40, 1000)));
        let p = steal_pct(parse_proc_stat_steal(a), parse_proc_stat_steal(b)).unwrap();
        assert!((p - 30.0 * 100.0 / 200.0).abs() < 1e-9);
        assert_eq!(parse_proc_stat_steal("cpu  1 2 3\n"), None);
        assert_eq!(steal_pct(parse_proc_stat_steal(a), None), None);
    }

    #[test]
    fn stat_cpu_ticks_and_comm() {
        assert_eq!(parse_stat_cpu_ticks(STAT), Some(1234 + 567));
        assert_eq!(parse_stat_comm(STAT), Some("tgtd"));
    }

    #[test]
    fn stat_with_spaces_and_parens_in_the_name() {
        let s = "77 (we ird) (x) R 1 77 77 0 -1 0 0 0 0 0 10 20 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat_cpu_ticks(s), Some(30));
        assert_eq!(parse_stat_comm(s), Some("we ird) (x"));
    }

    #[test]
    fn stat_truncated_is_none() {
        assert_eq!(parse_stat_cpu_ticks("1 (a) S 1 2 3"), None);
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
        assert_eq!(
            parse_stat_cpu_ticks("1 (a) S 1 1 1 0 -1 0 0 0 0 0 x 2"),
            None
        );
    }

    #[test]
    fn status_rss_and_cpu_model() {
        let st = "Name:\tferrited\nVmPeak:\t  100 kB\nVmRSS:\t    8123 kB\nThreads:\t3\n";
        assert_eq!(parse_status_rss_kib(st), Some(8123));
        assert_eq!(parse_status_rss_kib("Name: x\n"), None);
        let ci = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor @ 2.80GHz\n";
        assert_eq!(
            parse_cpu_model(ci).as_deref(),
            Some("Intel(R) Xeon(R) Processor @ 2.80GHz")
        );
    }

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        assert!(cpu_ticks(me).is_some());
        assert!(rss_kib(me).unwrap() > 0);
        assert!(clk_tck() > 0);
    }
}
