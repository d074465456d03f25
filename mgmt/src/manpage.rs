//! Manual pages rendered from the clap definitions of `ferrited` and
//! `ferritectl` (with `clap_mangen`), so the pages list exactly the options
//! the binaries accept. Each binary prints its own page through a hidden
//! option (`ferrited --print-man`, `ferritectl man`); `tools/package-deb`
//! installs them.
//!
//! On top of clap_mangen's NAME, SYNOPSIS, DESCRIPTION and OPTIONS, a page
//! gets a COMMANDS section with every visible subcommand, its usage, its
//! arguments and their help (clap_mangen's own SUBCOMMANDS section points to
//! one page per subcommand, which Ferrite does not ship), and the sections
//! the caller adds (FILES, ENVIRONMENT, SEE ALSO).

use std::io::{self, Write};

use clap_mangen::roff::{Roff, bold, italic, roman};

/// A section added after the generated ones: a list of terms with their
/// explanation, or paragraphs when a term is empty.
#[derive(Debug, Clone, Copy)]
pub struct Section<'a> {
    pub title: &'a str,
    pub items: &'a [(&'a str, &'a str)],
}

/// Writes the manual page of `cmd` in `section` (1 for commands, 8 for
/// daemons) followed by `extra`.
pub fn render(
    cmd: clap::Command,
    section: &str,
    extra: &[Section<'_>],
    w: &mut dyn Write,
) -> io::Result<()> {
    let mut cmd = annotate(cmd.disable_help_subcommand(true));
    cmd.build();
    let name = cmd.get_name().to_string();
    let man = clap_mangen::Man::new(cmd.clone())
        .section(section)
        .manual("Ferrite");
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    man.render_options_section(w)?;
    let subs: Vec<&clap::Command> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    let mut roff = Roff::new();
    if !subs.is_empty() {
        roff.control("SH", ["COMMANDS"]);
        for sub in subs {
            commands_entry(&mut roff, &name, sub);
        }
    }
    for s in extra {
        roff.control("SH", [s.title]);
        for (term, text) in s.items {
            if term.is_empty() {
                roff.control("PP", []);
            } else {
                roff.control("TP", []);
                roff.text([bold(*term)]);
            }
            roff.text([roman(*text)]);
        }
    }
    if let Some(v) = cmd.get_version() {
        roff.control("SH", ["VERSION"]);
        roff.text([roman(format!("{name} {v}"))]);
    }
    roff.to_writer(w)
}

/// Appends `[alias: --x]` and `[env: VAR]` to each option's help, as
/// `--help` shows them (clap_mangen does not).
fn annotate(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        let mut extra = Vec::new();
        for alias in a.get_visible_aliases().unwrap_or_default() {
            extra.push(format!("[alias: --{alias}]"));
        }
        if let Some(env) = a.get_env()
            && !a.is_hide_env_set()
        {
            extra.push(format!("[env: {}]", env.to_string_lossy()));
        }
        if extra.is_empty() {
            return a;
        }
        let help = a
            .get_long_help()
            .or_else(|| a.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        a.long_help(format!("{help} {}", extra.join(" ")))
    })
    .mut_subcommands(annotate)
}

/// One subcommand: its usage line, its help, then its arguments.
fn commands_entry(roff: &mut Roff, bin: &str, sub: &clap::Command) {
    let mut usage = sub.clone().bin_name(format!("{bin} {}", sub.get_name()));
    let line = usage.render_usage().to_string();
    let line = line.trim().strip_prefix("Usage:").unwrap_or(&line).trim();
    roff.control("TP", []);
    roff.text([bold(line.to_string())]);
    if let Some(about) = sub.get_long_about().or_else(|| sub.get_about()) {
        roff.text([roman(about.to_string())]);
    }
    let args: Vec<&clap::Arg> = sub
        .get_arguments()
        // Global options are the command's own, listed under OPTIONS.
        .filter(|a| !a.is_hide_set() && !a.is_global_set() && !is_builtin(a))
        .filter(|a| !a.is_positional() || a.get_help().is_some())
        .collect();
    if args.is_empty() {
        return;
    }
    roff.control("RS", []);
    for a in args {
        roff.control("TP", []);
        roff.text(arg_term(a));
        let help = a.get_long_help().or_else(|| a.get_help());
        let mut text = help.map(|h| h.to_string()).unwrap_or_default();
        let values: Vec<String> = a
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| v.get_name().to_string())
            .collect();
        if !values.is_empty() {
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&format!("One of: {}.", values.join(", ")));
        }
        if !text.is_empty() {
            roff.text([roman(text)]);
        }
    }
    roff.control("RE", []);
}

/// `-l, --long` for a flag, `--output FILE`, or the positional `FILE`.
fn arg_term(a: &clap::Arg) -> Vec<clap_mangen::roff::Inline> {
    let value = a
        .get_value_names()
        .and_then(|v| v.first())
        .map(|v| v.to_string())
        .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
    if a.is_positional() {
        return vec![italic(value)];
    }
    let mut names = Vec::new();
    if let Some(s) = a.get_short() {
        names.push(format!("-{s}"));
    }
    if let Some(l) = a.get_long() {
        names.push(format!("--{l}"));
    }
    let mut out = vec![bold(names.join(", "))];
    if a.get_action().takes_values() {
        out.push(roman(" "));
        out.push(italic(value));
    }
    out
}

/// clap's own `--help` and `--version`, which every command has.
fn is_builtin(a: &clap::Arg) -> bool {
    matches!(a.get_id().as_str(), "help" | "version")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser, Subcommand};

    /// A small program.
    #[derive(Parser)]
    #[command(name = "demo", version = "1.2.3")]
    struct Demo {
        /// Where to look.
        #[arg(long, value_name = "DIR", visible_alias = "spot", env = "DEMO_PLACE")]
        place: Option<String>,
        /// Not for people.
        #[arg(long, hide = true)]
        secret: bool,
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(Subcommand)]
    enum Cmd {
        /// Show a thing.
        Show {
            /// One line each.
            #[arg(short, long)]
            long: bool,
            what: Option<String>,
        },
        #[command(hide = true)]
        Hidden,
    }

    fn page() -> String {
        let mut out = Vec::new();
        let files = [("/etc/demo.json", "The configuration.")];
        render(
            Demo::command(),
            "8",
            &[Section {
                title: "FILES",
                items: &files,
            }],
            &mut out,
        )
        .expect("render to a Vec");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn a_page_has_options_commands_and_extra_sections_but_nothing_hidden() {
        let p = page();
        assert!(p.contains(".TH demo 8"), "{p}");
        assert!(p.contains("\\-\\-place"), "{p}");
        assert!(p.contains("[alias: \\-\\-spot] [env: DEMO_PLACE]"), "{p}");
        assert!(p.contains(".SH COMMANDS"), "{p}");
        assert!(p.contains("demo show"), "{p}");
        assert!(p.contains("One line each"), "{p}");
        assert!(p.contains(".SH FILES"), "{p}");
        assert!(p.contains("/etc/demo.json"), "{p}");
        assert!(p.contains("demo 1.2.3"), "{p}");
        assert!(!p.contains("secret"), "{p}");
        assert!(!p.contains("hidden"), "{p}");
    }
}
