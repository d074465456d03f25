//! Configuration files for the ferrited under test, built in code:
//! devices (nullio, fileio, blockio and their options), iSCSI targets with
//! portals, LUNs, initiator groups and CHAP users, SRP target ports, and
//! the `iscsi` and top-level options (keepalive, digests, reactor
//! settings). [`Config::json`] writes the JSON ferrited reads, keys in the
//! order they were given.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A JSON value whose objects keep their keys in the order they were set
/// in (serde_json's own maps sort them).
#[derive(Clone, Debug)]
enum J {
    Leaf(Value),
    Arr(Vec<J>),
    Obj(Obj),
}

impl J {
    fn write(&self, out: &mut String) {
        match self {
            J::Leaf(v) => {
                let _ = write!(out, "{v}");
            }
            J::Arr(items) => {
                out.push('[');
                for (n, item) in items.iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            J::Obj(o) => o.write(out),
        }
    }
}

/// A JSON object, keys in order.
#[derive(Clone, Debug, Default)]
struct Obj(Vec<(String, J)>);

impl Obj {
    fn put(&mut self, key: &str, value: J) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key.to_string(), value)),
        }
    }

    fn set(&mut self, key: &str, value: impl Into<Value>) {
        self.put(key, J::Leaf(value.into()));
    }

    /// Appends `item` to the array at `key`, making it if need be.
    fn push(&mut self, key: &str, item: J) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, J::Arr(items))) => items.push(item),
            _ => self.put(key, J::Arr(vec![item])),
        }
    }

    fn write(&self, out: &mut String) {
        out.push('{');
        for (n, (k, v)) in self.0.iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            let _ = write!(out, "{}:", Value::from(k.as_str()));
            v.write(out);
        }
        out.push('}');
    }
}

/// A whole configuration file.
#[derive(Clone, Debug, Default)]
pub struct Config {
    top: Obj,
    iscsi: Obj,
    devices: Vec<Device>,
    iscsi_targets: Vec<Target>,
    srp_targets: Vec<SrpTarget>,
}

impl Config {
    /// No device, no target, every option at its default.
    pub fn new() -> Config {
        Config::default()
    }

    /// Adds a device.
    pub fn device(mut self, d: Device) -> Config {
        self.devices.push(d);
        self
    }

    /// Adds an iSCSI target.
    pub fn target(mut self, t: Target) -> Config {
        self.iscsi_targets.push(t);
        self
    }

    /// Adds an SRP target port.
    pub fn srp_target(mut self, t: SrpTarget) -> Config {
        self.srp_targets.push(t);
        self
    }

    /// Sets an option of the `iscsi` section (`nop_in_interval_s`,
    /// `header_digests`, `max_connections`, `discovery_incoming_users`...).
    pub fn iscsi(mut self, key: &str, value: impl Into<Value>) -> Config {
        self.iscsi.set(key, value);
        self
    }

    /// CHAP on discovery sessions: a user they log in as.
    pub fn discovery_user(mut self, user: &str, secret: &str) -> Config {
        self.iscsi
            .push("discovery_incoming_users", user_entry(user, secret));
        self
    }

    /// Sets a top-level option (`cores`, `data_memory_mb`, reactor
    /// settings...).
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Config {
        self.top.set(key, value);
        self
    }

    /// The configuration as one line of JSON: the top-level options, then
    /// `iscsi` (if set), `devices` (if any) and `targets` (if any).
    pub fn json(&self) -> String {
        let mut o = self.top.clone();
        if !self.iscsi.0.is_empty() {
            o.put("iscsi", J::Obj(self.iscsi.clone()));
        }
        if !self.devices.is_empty() {
            let devices = self.devices.iter().map(|d| J::Obj(d.0.clone()));
            o.put("devices", J::Arr(devices.collect()));
        }
        let mut targets = Obj::default();
        if !self.iscsi_targets.is_empty() {
            let t = self.iscsi_targets.iter().map(|t| J::Obj(t.0.clone()));
            targets.put("iscsi", J::Arr(t.collect()));
        }
        if !self.srp_targets.is_empty() {
            let t = self.srp_targets.iter().map(|t| J::Obj(t.0.clone()));
            targets.put("srp", J::Arr(t.collect()));
        }
        if !targets.0.is_empty() {
            o.put("targets", J::Obj(targets));
        }
        let mut out = String::new();
        o.write(&mut out);
        out.push('\n');
        out
    }

    /// Writes [`Config::json`] to `path`; returns `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref();
        std::fs::write(path, self.json())
            .unwrap_or_else(|e| panic!("write configuration {}: {e}", path.display()));
        path.to_path_buf()
    }

    /// Writes it mode 0600, as a file holding CHAP secrets must be.
    pub fn write_private(&self, path: impl AsRef<Path>) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.write(path);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("chmod 0600 {}: {e}", path.display()));
        path
    }
}

/// One device (SCST's names for the handlers).
#[derive(Clone, Debug)]
pub struct Device(Obj);

impl Device {
    /// A device `name` of `handler` with no option.
    pub fn new(name: &str, handler: &str) -> Device {
        let mut o = Obj::default();
        o.set("name", name);
        o.set("handler", handler);
        Device(o)
    }

    /// `vdisk_nullio` of `size` bytes (reads zeros, writes vanish).
    pub fn nullio(name: &str, size: u64) -> Device {
        Device::new(name, "vdisk_nullio").set("size", size)
    }

    /// `vdisk_nullio` of `size` bytes that keeps what is written in memory.
    pub fn mem(name: &str, size: u64) -> Device {
        Device::nullio(name, size).set("mem", true)
    }

    /// `vdisk_fileio` on `file`, `size` bytes.
    pub fn fileio(name: &str, file: &Path, size: u64) -> Device {
        Device::new(name, "vdisk_fileio")
            .set("filename", file.display().to_string())
            .set("size", size)
    }

    /// `vdisk_blockio` on the block device `file`.
    pub fn blockio(name: &str, file: &Path) -> Device {
        Device::new(name, "vdisk_blockio").set("filename", file.display().to_string())
    }

    /// Sets an option (`thin_provisioned`, `blocksize`, `write_through`...).
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Device {
        self.0.set(key, value);
        self
    }

    /// The device's name.
    pub fn name(&self) -> String {
        self.0
            .0
            .iter()
            .find_map(|(k, v)| match v {
                J::Leaf(Value::String(s)) if k == "name" => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default()
    }
}

/// A LUN map entry: `{"lun": N, "device": NAME}`.
fn lun_entry(lun: u64, device: &str) -> J {
    let mut o = Obj::default();
    o.set("lun", lun);
    o.set("device", device);
    J::Obj(o)
}

/// A CHAP user: `{"user": U, "secret": S}`.
fn user_entry(user: &str, secret: &str) -> J {
    let mut o = Obj::default();
    o.set("user", user);
    o.set("secret", secret);
    J::Obj(o)
}

/// An iSCSI target.
#[derive(Clone, Debug)]
pub struct Target(Obj);

impl Target {
    /// Target `name` (an IQN), with nothing else.
    pub fn new(name: &str) -> Target {
        let mut o = Obj::default();
        o.set("name", name);
        Target(o)
    }

    /// Adds a portal (`127.0.0.1:3260`, `[::1]:3260`).
    pub fn portal(mut self, addr: impl ToString) -> Target {
        self.0.push("portals", J::Leaf(addr.to_string().into()));
        self
    }

    /// Maps `device` at `lun` in the default LUN map.
    pub fn lun(mut self, lun: u64, device: &str) -> Target {
        self.0.push("luns", lun_entry(lun, device));
        self
    }

    /// Adds an initiator group.
    pub fn group(mut self, g: Group) -> Target {
        self.0.push("ini_groups", J::Obj(g.0));
        self
    }

    /// CHAP: a user initiators log in as.
    pub fn incoming_user(mut self, user: &str, secret: &str) -> Target {
        self.0.push("incoming_users", user_entry(user, secret));
        self
    }

    /// Mutual CHAP: the name and secret the target answers with.
    pub fn outgoing_user(mut self, user: &str, secret: &str) -> Target {
        self.0.put("outgoing_user", user_entry(user, secret));
        self
    }

    /// Sets any other key (`enabled`, `tpgt`, `group_incoming_users`...).
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Target {
        self.0.set(key, value);
        self
    }
}

/// An initiator group of a target: who it holds and the LUNs they see.
#[derive(Clone, Debug)]
pub struct Group(Obj);

impl Group {
    /// Group `name`, empty.
    pub fn new(name: &str) -> Group {
        let mut o = Obj::default();
        o.set("name", name);
        Group(o)
    }

    /// Adds an initiator name or pattern (`iqn.2026-11.org.ferrite:admin*`).
    pub fn initiator(mut self, pattern: &str) -> Group {
        self.0.push("initiators", J::Leaf(pattern.into()));
        self
    }

    /// Maps `device` at `lun` for this group.
    pub fn lun(mut self, lun: u64, device: &str) -> Group {
        self.0.push("luns", lun_entry(lun, device));
        self
    }

    /// Sets any other key.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Group {
        self.0.set(key, value);
        self
    }
}

/// An SRP target port.
#[derive(Clone, Debug)]
pub struct SrpTarget(Obj);

impl SrpTarget {
    /// Port `name` with `port_id` (32 hex digits) on the in-process soft
    /// RDMA provider listening on the Unix socket `listen`.
    pub fn soft(name: &str, port_id: &str, listen: &Path) -> SrpTarget {
        let mut provider = Obj::default();
        provider.set("kind", "soft");
        provider.set("listen", listen.display().to_string());
        let mut o = Obj::default();
        o.set("name", name);
        o.set("port_id", port_id);
        o.put("provider", J::Obj(provider));
        SrpTarget(o)
    }

    /// Port `name` on the provider `provider` (`{"kind": "verbs", "port":
    /// 1, "listen": ADDR}`...), with no port id (ferrited derives one).
    pub fn on(name: &str, provider: Value) -> SrpTarget {
        let mut o = Obj::default();
        o.set("name", name);
        o.set("provider", provider);
        SrpTarget(o)
    }

    /// Maps `device` at `lun`.
    pub fn lun(mut self, lun: u64, device: &str) -> SrpTarget {
        self.0.push("luns", lun_entry(lun, device));
        self
    }

    /// Adds an initiator group.
    pub fn group(mut self, g: Group) -> SrpTarget {
        self.0.push("ini_groups", J::Obj(g.0));
        self
    }

    /// Sets any other key.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> SrpTarget {
        self.0.set(key, value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_keys_in_the_order_given() {
        let c = Config::new()
            .iscsi("nop_in_interval_s", 1)
            .device(Device::mem("m0", 16 << 20))
            .target(
                Target::new("iqn.t")
                    .set("enabled", true)
                    .portal("127.0.0.1:3260")
                    .lun(0, "m0")
                    .incoming_user("u", "s"),
            );
        assert_eq!(
            c.json(),
            concat!(
                r#"{"iscsi":{"nop_in_interval_s":1},"#,
                r#""devices":[{"name":"m0","handler":"vdisk_nullio","size":16777216,"mem":true}],"#,
                r#""targets":{"iscsi":[{"name":"iqn.t","enabled":true,"portals":["127.0.0.1:3260"],"#,
                r#""luns":[{"lun":0,"device":"m0"}],"incoming_users":[{"user":"u","secret":"s"}]}]}}"#,
                "\n"
            )
        );
    }

    #[test]
    fn the_json_parses() {
        let c = Config::new()
            .set("cores", 2)
            .device(Device::fileio("f", Path::new("/tmp/a \"b\".img"), 512))
            .target(Target::new("t").group(Group::new("g").initiator("iqn.x*").lun(0, "f")));
        let v: Value = serde_json::from_str(&c.json()).expect("valid JSON");
        assert_eq!(v["devices"][0]["filename"], "/tmp/a \"b\".img");
        assert_eq!(
            v["targets"]["iscsi"][0]["ini_groups"][0]["initiators"][0],
            "iqn.x*"
        );
    }
}
