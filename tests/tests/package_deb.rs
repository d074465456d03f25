//! The Debian package (`tools/package-deb`, docs/packaging.md), built from
//! the binaries next to this test (tools/test-all's release build): every
//! file it promises is in it with its mode and owner; the control fields
//! and maintainer scripts enable, start and stop the unit through
//! deb-systemd-helper/-invoke, and a purge keeps the disk images; the unit
//! has the settings ferrited relies on and passes `systemd-analyze verify`;
//! both manual pages render with `man` and list every option `--help` lists;
//! the completions parse.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ferrite_tests::{ferrited_path, require_tool, run_with_timeout};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run(cmd: &mut Command, what: &str) -> String {
    ok(run_with_timeout(cmd, Duration::from_secs(120)), what)
}

/// The package, built once per test binary into its own directory.
struct Built {
    _dir: tempfile::TempDir,
    deb: PathBuf,
    /// `dpkg-deb -x` of it.
    root: PathBuf,
    /// `dpkg-deb -e` of it: control, md5sums, maintainer scripts.
    control: PathBuf,
    work: PathBuf,
}

fn build() -> Built {
    require_tool("dpkg-deb", "dpkg");
    let bin_dir = ferrited_path()
        .parent()
        .expect("ferrited has a directory")
        .to_path_buf();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(
        Command::new(repo().join("tools/package-deb"))
            .arg("--bin-dir")
            .arg(&bin_dir)
            .arg("--out")
            .arg(dir.path()),
        "tools/package-deb",
    );
    let deb = PathBuf::from(
        out.lines()
            .last()
            .expect("package-deb prints the package")
            .trim(),
    );
    let arch = run(Command::new("dpkg").arg("--print-architecture"), "dpkg")
        .trim()
        .to_string();
    assert_eq!(
        deb.file_name().and_then(|n| n.to_str()),
        Some(format!("ferrite_{}_{arch}.deb", env!("CARGO_PKG_VERSION")).as_str())
    );
    let root = dir.path().join("root");
    let control = dir.path().join("control");
    run(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
        "dpkg-deb -x",
    );
    run(
        Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control),
        "dpkg-deb -e",
    );
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    Built {
        deb,
        root,
        control,
        work,
        _dir: dir,
    }
}

/// `dpkg-deb -c`: path (without the leading `.`) -> (mode, owner).
fn listing(deb: &Path) -> BTreeMap<String, (String, String)> {
    let text = run(Command::new("dpkg-deb").arg("-c").arg(deb), "dpkg-deb -c");
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() >= 6, "odd dpkg-deb -c line: {line}");
        let path = f[5].trim_start_matches('.').trim_end_matches('/');
        m.insert(path.to_string(), (f[0].to_string(), f[1].to_string()));
    }
    m
}

#[test]
fn the_package_holds_every_promised_file_with_its_mode() {
    let b = build();
    let l = listing(&b.deb);
    let want = [
        ("/usr/sbin/ferrited", "-rwxr-xr-x"),
        ("/usr/bin/ferritectl", "-rwxr-xr-x"),
        ("/lib/systemd/system/ferrited.service", "-rw-r--r--"),
        ("/etc/ferrite", "drwxr-xr-x"),
        ("/usr/share/man/man8/ferrited.8.gz", "-rw-r--r--"),
        ("/usr/share/man/man1/ferritectl.1.gz", "-rw-r--r--"),
        (
            "/usr/share/bash-completion/completions/ferritectl",
            "-rw-r--r--",
        ),
        (
            "/usr/share/bash-completion/completions/ferrited",
            "-rw-r--r--",
        ),
        (
            "/usr/share/zsh/vendor-completions/_ferritectl",
            "-rw-r--r--",
        ),
        ("/usr/share/zsh/vendor-completions/_ferrited", "-rw-r--r--"),
        (
            "/usr/share/fish/vendor_completions.d/ferritectl.fish",
            "-rw-r--r--",
        ),
        (
            "/usr/share/fish/vendor_completions.d/ferrited.fish",
            "-rw-r--r--",
        ),
        ("/usr/share/doc/ferrite/copyright", "-rw-r--r--"),
    ];
    for (path, mode) in want {
        let got = l.get(path);
        assert_eq!(
            got.map(|(m, _)| m.as_str()),
            Some(mode),
            "{path} in the package: {l:#?}"
        );
    }
    for (path, (_, owner)) in &l {
        assert_eq!(owner, "root/root", "{path}");
    }
    // No file in /etc: the package ships no conffile, ferrite.json is the
    // administrator's (ferritectl save).
    assert!(!l.keys().any(|p| p.starts_with("/etc/ferrite/")), "{l:#?}");
    let copyright =
        std::fs::read_to_string(b.root.join("usr/share/doc/ferrite/copyright")).expect("copyright");
    assert!(
        copyright.contains(&format!("License: {}", env!("CARGO_PKG_LICENSE"))),
        "{copyright}"
    );
    // md5sums covers every file, and matches.
    let sums = std::fs::read_to_string(b.control.join("md5sums")).expect("md5sums");
    let files = l.iter().filter(|(_, (m, _))| m.starts_with('-')).count();
    assert_eq!(sums.lines().count(), files, "{sums}");
    run(
        Command::new("md5sum")
            .args(["-c", "--quiet"])
            .arg(b.control.join("md5sums"))
            .current_dir(&b.root),
        "md5sum -c",
    );
    // The packaged binaries are the ones built, without debug sections.
    let v = run(
        Command::new(b.root.join("usr/sbin/ferrited")).arg("--version"),
        "ferrited --version",
    );
    assert_eq!(v.trim(), format!("ferrited {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn control_fields_name_the_dependencies_and_suggest_rdma_core() {
    let b = build();
    let field = |f: &str| {
        run(
            Command::new("dpkg-deb").arg("-f").arg(&b.deb).arg(f),
            "dpkg-deb -f",
        )
        .trim()
        .to_string()
    };
    assert_eq!(field("Package"), "ferrite");
    assert_eq!(field("Version"), env!("CARGO_PKG_VERSION"));
    assert!(field("Maintainer").contains('<'));
    assert!(!field("Description").is_empty());
    let depends = field("Depends");
    assert!(depends.contains("libc6"), "Depends: {depends}");
    let suggests = field("Suggests");
    for p in ["libibverbs1", "librdmacm1"] {
        assert!(suggests.contains(p), "Suggests: {suggests}");
    }
    // rdma-core is a dependency only of a binary that links it.
    let ldd = run(
        Command::new("ldd").arg(b.root.join("usr/sbin/ferrited")),
        "ldd ferrited",
    );
    if !ldd.contains("libibverbs") {
        assert!(!depends.contains("libibverbs"), "Depends: {depends}");
        assert!(!depends.contains("librdmacm"), "Depends: {depends}");
    }
}

/// Runs a maintainer script with deb-systemd-helper, deb-systemd-invoke and
/// systemctl replaced by recorders, in a PATH of only those and the tools
/// the scripts use, with the system paths they touch moved under `fake`.
/// Returns what the recorders saw.
fn run_script(
    b: &Built,
    script: &str,
    args: &[&str],
    fake: &Path,
    systemd_running: bool,
) -> String {
    let bin = b.work.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let calls = b.work.join("calls");
    for tool in ["deb-systemd-helper", "deb-systemd-invoke", "systemctl"] {
        let p = bin.join(tool);
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\necho \"{tool} $*\" >>{}\nexit 0\n",
                calls.display()
            ),
        )
        .expect("recorder");
        run(Command::new("chmod").arg("755").arg(&p), "chmod");
    }
    for tool in ["rm", "rmdir", "find", "mkdir", "cat"] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .expect("coreutils/findutils tool");
        let link = bin.join(tool);
        if !link.exists() {
            std::os::unix::fs::symlink(real, link).expect("symlink");
        }
    }
    let text = std::fs::read_to_string(b.control.join(script)).expect("maintainer script");
    let run_dir = if systemd_running {
        fake.join("run/systemd/system")
    } else {
        fake.join("no-systemd")
    };
    std::fs::create_dir_all(fake.join("run/systemd/system")).expect("fake run dir");
    let text = text
        .replace("/run/systemd/system", run_dir.to_str().expect("utf-8"))
        .replace(
            "/etc/ferrite",
            fake.join("etc/ferrite").to_str().expect("utf-8"),
        )
        .replace(
            "/var/lib/ferrite",
            fake.join("var/lib/ferrite").to_str().expect("utf-8"),
        );
    let copy = b.work.join(script);
    std::fs::write(&copy, text).expect("script copy");
    let _ = std::fs::remove_file(&calls);
    run(
        Command::new("/bin/sh")
            .arg(&copy)
            .args(args)
            .env_clear()
            .env("PATH", &bin),
        script,
    );
    std::fs::read_to_string(&calls).unwrap_or_default()
}

#[test]
fn maintainer_scripts_enable_start_stop_and_a_purge_keeps_the_disk_images() {
    let b = build();
    let fake = b.work.join("fake");
    // A new installation: enabled, then started.
    let c = run_script(&b, "postinst", &["configure"], &fake, true);
    assert!(
        c.contains("deb-systemd-helper unmask ferrited.service"),
        "{c}"
    );
    assert!(
        c.contains("deb-systemd-helper enable ferrited.service"),
        "{c}"
    );
    assert!(c.contains("systemctl --system daemon-reload"), "{c}");
    assert!(
        c.contains("deb-systemd-invoke start ferrited.service"),
        "{c}"
    );
    // An upgrade restarts it; without systemd running nothing is started.
    let c = run_script(&b, "postinst", &["configure", "0.0.1"], &fake, true);
    assert!(
        c.contains("deb-systemd-invoke restart ferrited.service"),
        "{c}"
    );
    let c = run_script(&b, "postinst", &["configure"], &fake, false);
    assert!(
        c.contains("deb-systemd-helper enable ferrited.service"),
        "{c}"
    );
    assert!(!c.contains("deb-systemd-invoke"), "{c}");
    let c = run_script(&b, "prerm", &["remove"], &fake, true);
    assert!(
        c.contains("deb-systemd-invoke stop ferrited.service"),
        "{c}"
    );
    let c = run_script(&b, "prerm", &["upgrade", "0.2.0"], &fake, true);
    assert!(
        !c.contains("stop"),
        "an upgrade stops nothing in prerm: {c}"
    );

    // State as a running ferrited leaves it.
    let state = fake.join("var/lib/ferrite");
    let etc = fake.join("etc/ferrite");
    std::fs::create_dir_all(state.join("devices/disk0")).expect("state");
    std::fs::create_dir_all(state.join("devices/gone")).expect("state");
    std::fs::create_dir_all(&etc).expect("etc");
    for f in [
        state.join("disk0.img"),
        state.join("ferrite.json"),
        state.join("devices/disk0/pr_state"),
        etc.join("ferrite.json"),
    ] {
        std::fs::write(&f, b"x").expect("state file");
    }
    // Removal keeps everything and masks the unit.
    let c = run_script(&b, "postrm", &["remove"], &fake, true);
    assert!(
        c.contains("deb-systemd-helper mask ferrited.service"),
        "{c}"
    );
    assert!(state.join("disk0.img").exists() && etc.join("ferrite.json").exists());
    assert!(state.join("ferrite.json").exists());
    // Purge removes the configuration, keeps the image and its reservations.
    let c = run_script(&b, "postrm", &["purge"], &fake, true);
    assert!(
        c.contains("deb-systemd-helper purge ferrited.service"),
        "{c}"
    );
    assert!(!etc.exists(), "purge keeps /etc/ferrite");
    assert!(!state.join("ferrite.json").exists());
    assert!(
        state.join("disk0.img").exists(),
        "purge removed the disk image"
    );
    assert!(state.join("devices/disk0/pr_state").exists());
    assert!(!state.join("devices/gone").exists());
    // With nothing of value left, the state directory goes too.
    std::fs::remove_file(state.join("disk0.img")).expect("rm");
    std::fs::remove_file(state.join("devices/disk0/pr_state")).expect("rm");
    run_script(&b, "postrm", &["purge"], &fake, false);
    assert!(!state.exists(), "an empty state directory is kept");
}

/// `[Section] Key=Value` of a unit file; a key given twice keeps the last.
fn unit(text: &str) -> BTreeMap<(String, String), String> {
    let mut m = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            section = line.trim_matches(['[', ']']).to_string();
            continue;
        }
        let (k, v) = line.split_once('=').expect("Key=Value");
        m.insert(
            (section.clone(), k.trim().to_string()),
            v.trim().to_string(),
        );
    }
    m
}

#[test]
fn the_unit_is_type_notify_with_state_runtime_limits_and_verifies() {
    let b = build();
    let path = b.root.join("lib/systemd/system/ferrited.service");
    let text = std::fs::read_to_string(&path).expect("unit");
    let u = unit(&text);
    let get = |s: &str, k: &str| u.get(&(s.to_string(), k.to_string())).cloned();
    for (s, k, v) in [
        ("Service", "Type", "notify"),
        ("Service", "ExecStart", "/usr/sbin/ferrited"),
        ("Service", "Restart", "on-failure"),
        ("Service", "StateDirectory", "ferrite"),
        ("Service", "RuntimeDirectory", "ferrite"),
        ("Service", "LimitMEMLOCK", "infinity"),
        ("Install", "WantedBy", "multi-user.target"),
    ] {
        assert_eq!(get(s, k).as_deref(), Some(v), "[{s}] {k}=\n{text}");
    }
    let nofile: u64 = get("Service", "LimitNOFILE")
        .and_then(|v| v.parse().ok())
        .expect("LimitNOFILE a number");
    assert!(nofile >= 65536, "LimitNOFILE={nofile}");
    // No --state-dir: the control socket is the root default, which
    // RuntimeDirectory=ferrite creates.
    let exec = get("Service", "ExecStart").unwrap_or_default();
    assert!(!exec.contains("--state-dir"), "{exec}");
    // Hardening that would close block devices, /dev/infiniband or io_uring.
    for k in [
        "PrivateDevices",
        "DevicePolicy",
        "DeviceAllow",
        "ProtectClock",
        "SystemCallFilter",
    ] {
        assert!(get("Service", k).is_none(), "{k}= breaks a target:\n{text}");
    }
    assert_ne!(get("Service", "ProtectSystem").as_deref(), Some("strict"));
    // ExecReload, if any, really reloads: ferritectl apply of the file
    // ferrited reads.
    if let Some(r) = get("Service", "ExecReload") {
        assert_eq!(r, "/usr/bin/ferritectl apply /etc/ferrite/ferrite.json");
    }

    if !Path::new("/usr/bin/systemd-analyze").exists() {
        eprintln!(
            "SKIP systemd-analyze verify: systemd-analyze is not installed (Debian package systemd)"
        );
        return;
    }
    // Verified against the package's own binaries and manual pages (the
    // unit's absolute paths rewritten into the extracted root).
    let copy = b.work.join("ferrited.service");
    let rooted = text
        .replace(
            "=/usr/sbin/ferrited",
            &format!("={}", b.root.join("usr/sbin/ferrited").display()),
        )
        .replace(
            "=/usr/bin/ferritectl",
            &format!("={}", b.root.join("usr/bin/ferritectl").display()),
        );
    std::fs::write(&copy, rooted).expect("unit copy");
    let out = run_with_timeout(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(&copy)
            .env("MANPATH", b.root.join("usr/share/man"))
            .env("SYSTEMD_LOG_COLOR", "0"),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("ferrited.service"),
        "systemd-analyze verify: {}\n{err}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `man -l PAGE`, plain text, wide enough that nothing is hyphenated.
fn man(page: &Path) -> String {
    run(
        Command::new("man")
            .arg("-l")
            .arg(page)
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .env("MANWIDTH", "400")
            .env("LC_ALL", "C"),
        "man -l",
    )
}

/// The long options and their aliases `--help` lists (all but --help and
/// --version).
fn options(bin: &Path, args: &[&str]) -> Vec<String> {
    let help = run(Command::new(bin).args(args).arg("--help"), "--help");
    let mut v: Vec<String> = help
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .filter(|w| *w != "--help" && *w != "--version")
        .map(str::to_string)
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn both_manual_pages_render_and_list_every_option() {
    require_tool("man", "man-db");
    let b = build();
    let ferrited = b.root.join("usr/sbin/ferrited");
    let ferritectl = b.root.join("usr/bin/ferritectl");

    let page = man(&b.root.join("usr/share/man/man8/ferrited.8.gz"));
    let opts = options(&ferrited, &[]);
    assert!(opts.len() >= 8, "{opts:?}");
    for o in &opts {
        assert!(page.contains(o.as_str()), "ferrited(8) lacks {o}:\n{page}");
    }
    for s in [
        "FILES",
        "/etc/ferrite/ferrite.json",
        "/var/lib/ferrite",
        "NOTIFY_SOCKET",
        "ENVIRONMENT",
    ] {
        assert!(page.contains(s), "ferrited(8) lacks {s}:\n{page}");
    }
    assert!(
        !page.contains("print-man") && !page.contains("print-completions"),
        "{page}"
    );

    let page = man(&b.root.join("usr/share/man/man1/ferritectl.1.gz"));
    for o in options(&ferritectl, &[]) {
        assert!(
            page.contains(o.as_str()),
            "ferritectl(1) lacks {o}:\n{page}"
        );
    }
    let help = run(Command::new(&ferritectl).arg("--help"), "ferritectl --help");
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 10, "{help}");
    for c in &commands {
        assert!(
            page.contains(&format!("ferritectl {c}")),
            "ferritectl(1) lacks the command {c}:\n{page}"
        );
        for o in options(&ferritectl, &[c]) {
            assert!(
                page.contains(o.as_str()),
                "ferritectl(1) lacks {c} {o}:\n{page}"
            );
        }
    }
    assert!(
        !page.contains("ferritectl man"),
        "the hidden man command is listed:\n{page}"
    );
    // The root default socket (ferrite_mgmt::server::DEFAULT_SOCKET), in
    // the unit's RuntimeDirectory=ferrite.
    assert!(page.contains("/run/ferrite/ferrited.sock"), "{page}");
}

#[test]
fn the_completions_are_for_their_shells() {
    let b = build();
    let share = b.root.join("usr/share");
    for name in ["ferritectl", "ferrited"] {
        let bash = share.join("bash-completion/completions").join(name);
        let text = std::fs::read_to_string(&bash).expect("bash completion");
        assert!(text.contains(&format!("complete -F _{name}")), "{text}");
        if Path::new("/bin/bash").exists() {
            run(Command::new("/bin/bash").arg("-n").arg(&bash), "bash -n");
        }
        let zsh = std::fs::read_to_string(
            share
                .join("zsh/vendor-completions")
                .join(format!("_{name}")),
        )
        .expect("zsh completion");
        assert!(zsh.starts_with(&format!("#compdef {name}")), "{zsh}");
        let fish = std::fs::read_to_string(
            share
                .join("fish/vendor_completions.d")
                .join(format!("{name}.fish")),
        )
        .expect("fish completion");
        assert!(fish.contains(&format!("complete -c {name}")), "{fish}");
    }
    let ctl = std::fs::read_to_string(share.join("bash-completion/completions/ferritectl"))
        .expect("bash completion");
    for c in ["import-scst", "save", "apply", "--socket"] {
        assert!(ctl.contains(c), "ferritectl's bash completion lacks {c}");
    }
    let d = std::fs::read_to_string(share.join("bash-completion/completions/ferrited"))
        .expect("bash completion");
    assert!(d.contains("--config") && d.contains("--listen"), "{d}");
}
