//! `streamgate synth`: grows a capture into a large single-run capture.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::ExitCode;

/// Runs the subcommand.
pub fn run(capture: &Path, mib: usize, output: &Path) -> Result<ExitCode> {
    let bytes =
        std::fs::read(capture).with_context(|| format!("cannot read {}", capture.display()))?;
    let target = mib << 20;
    let big = streamgate_wire::synth::inflate(&bytes, target);
    if big.len() < target {
        bail!(
            "{} has no streamed text or thinking to repeat (an error stream, tool arguments \
             only, or a reply in one frame): pick a capture with text or thinking deltas",
            capture.display()
        );
    }
    std::fs::write(output, &big).with_context(|| format!("cannot write {}", output.display()))?;
    eprintln!("wrote {} bytes to {}", big.len(), output.display());
    Ok(ExitCode::SUCCESS)
}
