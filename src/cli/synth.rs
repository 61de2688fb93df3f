//! `streamgate synth`: grows a capture into a large single-run capture.

use anyhow::{Context, Result};
use std::path::Path;
use std::process::ExitCode;

/// Runs the subcommand.
pub fn run(capture: &Path, mib: usize, output: &Path) -> Result<ExitCode> {
    let bytes =
        std::fs::read(capture).with_context(|| format!("cannot read {}", capture.display()))?;
    let big = streamgate_wire::synth::inflate(&bytes, mib << 20);
    std::fs::write(output, &big).with_context(|| format!("cannot write {}", output.display()))?;
    eprintln!("wrote {} bytes to {}", big.len(), output.display());
    Ok(ExitCode::SUCCESS)
}
