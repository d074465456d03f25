//! Where ferrited's configuration comes from, and so where `ferritectl save`
//! writes it back:
//!
//! - `--config FILE`: that file;
//! - else, with `--state-dir DIR` (or `FERRITE_STATE_DIR`): the embedded
//!   default, saved to `DIR/ferrite.json`. An instance with a state
//!   directory of its own keeps everything there (its socket too) and never
//!   reads the system's configuration, which also keeps tests away from a
//!   host's `/etc`;
//! - else [`SYSTEM_CONFIG`] when it exists (the packaged service);
//! - else the embedded default, saved to [`SYSTEM_CONFIG`] as root when its
//!   directory exists (the package installs it), so what is saved is what
//!   the next start reads; otherwise to `ferrite.json` in the state
//!   directory.

use std::path::{Path, PathBuf};

/// The system's configuration file.
pub const SYSTEM_CONFIG: &str = "/etc/ferrite/ferrite.json";

/// What ferrited starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A configuration file (`--config`, or [`SYSTEM_CONFIG`]).
    File(PathBuf),
    /// The embedded default.
    Embedded,
}

/// The choice: what to load and where `save` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub origin: Origin,
    pub save: PathBuf,
}

/// What the choice depends on, gathered by [`Facts::probe`] (kept apart so
/// the rules are tested without touching `/etc`).
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// `--config`.
    pub config: Option<&'a Path>,
    /// Whether `--state-dir` (or `FERRITE_STATE_DIR`) was given.
    pub state_dir_given: bool,
    /// The state directory in effect.
    pub state_dir: &'a Path,
    pub root: bool,
    /// The system configuration file and whether it, and its directory, exist.
    pub system: &'a Path,
    pub system_exists: bool,
    pub system_dir_exists: bool,
}

impl<'a> Facts<'a> {
    /// Looks at the file system for [`SYSTEM_CONFIG`].
    pub fn probe(
        config: Option<&'a Path>,
        state_dir_given: bool,
        state_dir: &'a Path,
        root: bool,
    ) -> Facts<'a> {
        let system = Path::new(SYSTEM_CONFIG);
        Facts {
            config,
            state_dir_given,
            state_dir,
            root,
            system,
            system_exists: system.exists(),
            system_dir_exists: system.parent().is_some_and(Path::is_dir),
        }
    }

    /// The rules of the module's documentation.
    pub fn choose(&self) -> Choice {
        let local = || self.state_dir.join("ferrite.json");
        if let Some(c) = self.config {
            return Choice {
                origin: Origin::File(c.to_path_buf()),
                save: c.to_path_buf(),
            };
        }
        if self.state_dir_given {
            return Choice {
                origin: Origin::Embedded,
                save: local(),
            };
        }
        if self.system_exists {
            return Choice {
                origin: Origin::File(self.system.to_path_buf()),
                save: self.system.to_path_buf(),
            };
        }
        let save = if self.root && self.system_dir_exists {
            self.system.to_path_buf()
        } else {
            local()
        };
        Choice {
            origin: Origin::Embedded,
            save,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(config: Option<&'a Path>, state_dir_given: bool) -> Facts<'a> {
        Facts {
            config,
            state_dir_given,
            state_dir: Path::new("/var/lib/ferrite"),
            root: true,
            system: Path::new("/etc/ferrite/ferrite.json"),
            system_exists: true,
            system_dir_exists: true,
        }
    }

    #[test]
    fn a_given_file_is_read_and_saved() {
        let c = facts(Some(Path::new("/srv/f.json")), true).choose();
        assert_eq!(c.origin, Origin::File("/srv/f.json".into()));
        assert_eq!(c.save, PathBuf::from("/srv/f.json"));
    }

    #[test]
    fn the_system_file_is_read_and_saved_when_it_exists() {
        let c = facts(None, false).choose();
        assert_eq!(c.origin, Origin::File("/etc/ferrite/ferrite.json".into()));
        assert_eq!(c.save, PathBuf::from("/etc/ferrite/ferrite.json"));
    }

    #[test]
    fn a_state_directory_of_its_own_never_reads_the_system_file() {
        let mut f = facts(None, true);
        f.state_dir = Path::new("/tmp/t");
        let c = f.choose();
        assert_eq!(c.origin, Origin::Embedded);
        assert_eq!(c.save, PathBuf::from("/tmp/t/ferrite.json"));
    }

    #[test]
    fn without_the_system_file_root_saves_the_default_where_the_next_start_reads() {
        let mut f = facts(None, false);
        f.system_exists = false;
        let c = f.choose();
        assert_eq!(c.origin, Origin::Embedded);
        assert_eq!(c.save, PathBuf::from("/etc/ferrite/ferrite.json"));
        f.system_dir_exists = false;
        assert_eq!(
            f.choose().save,
            PathBuf::from("/var/lib/ferrite/ferrite.json")
        );
        f.system_dir_exists = true;
        f.root = false;
        f.state_dir = Path::new("/home/u/.local/state/ferrite");
        assert_eq!(
            f.choose().save,
            PathBuf::from("/home/u/.local/state/ferrite/ferrite.json")
        );
    }
}
