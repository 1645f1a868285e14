//! Placeholder while the owning work is in progress; replaced before it lands.

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("this subcommand is not built yet")
}
