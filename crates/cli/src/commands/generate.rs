//! `spillway completions SHELL` and `spillway man DIR`: shell completions and man pages
//! generated from the command-line definition itself, so they never drift from it.

use std::path::{Path, PathBuf};

use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Where to write `spillway.1` and one `spillway-<command>.1` per subcommand.
    pub directory: PathBuf,
}

/// Prints the completion script of `command` for one shell.
pub fn completions(args: &CompletionsArgs, mut command: clap::Command) {
    let name = command.get_name().to_string();
    // Rendered first: the generator panics on a failed write, and stdout may be a closed pipe.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, name, &mut script);
    print!("{}", String::from_utf8_lossy(&script));
}

/// Writes a man page for `command` and, recursively, each visible subcommand.
pub fn man_pages(args: &ManArgs, command: clap::Command) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.directory)
        .with_context(|| format!("creating {}", args.directory.display()))?;
    let mut command = command;
    command.build();
    let written = write_pages(&command, command.get_name(), &args.directory)?;
    println!("{written} man pages in {}", args.directory.display());
    Ok(())
}

/// One page for `command` named `name`, then its subcommands'; returns how many were written.
fn write_pages(command: &clap::Command, name: &str, directory: &Path) -> anyhow::Result<usize> {
    let page = command.clone().name(name.to_string());
    let mut roff = Vec::new();
    clap_mangen::Man::new(page).render(&mut roff).with_context(|| format!("rendering {name}"))?;
    let path = directory.join(format!("{name}.1"));
    std::fs::write(&path, roff).with_context(|| format!("writing {}", path.display()))?;
    let mut written = 1;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        written += write_pages(sub, &format!("{name}-{}", sub.get_name()), directory)?;
    }
    Ok(written)
}
