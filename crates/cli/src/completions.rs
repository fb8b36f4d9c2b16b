//! `mlx-gen completions SHELL` and `mlx-gen man`: shell completions and a roff man page, generated from the clap definitions.
use anyhow::Result;
use clap_complete::Shell;
use std::io::Write;

/// Writes the completion script of `shell` for `cmd` to stdout.
pub fn completions(shell: Shell, cmd: &mut clap::Command) -> Result<()> {
    let name = cmd.get_name().to_owned();
    clap_complete::generate(shell, cmd, name, &mut std::io::stdout().lock());
    Ok(())
}

/// Writes the man page of `cmd` (roff) to stdout, one section per subcommand after the main page.
pub fn man(cmd: clap::Command) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let mut cmd = cmd.version(env!("CARGO_PKG_VERSION"));
    cmd.build();
    clap_mangen::Man::new(cmd.clone()).render(&mut out)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("{}-{}", cmd.get_name(), sub.get_name());
        writeln!(out, ".SH \"{}\"", name.to_uppercase())?;
        // A short-lived process: leaking the name is fine (clap's `string` feature is off).
        let sub = sub.clone().name(&*Box::leak(name.into_boxed_str()));
        let man = clap_mangen::Man::new(sub);
        man.render_description_section(&mut out)?;
        man.render_options_section(&mut out)?;
    }
    Ok(())
}
