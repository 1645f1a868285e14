//! Step 7: unmodified programs (cp, dd, Python) write through the FUSE mount of the demo's
//! servers (`spillway mount --background`); their files are read back, before and after a
//! remount.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use spillway_proto::Endpoint;
use spillway_types::{format_bytes, EpochId, MIB};

use crate::cluster::log_tail;
use crate::workload::rank_data;

/// Unmounts a demo mount when dropped (`spillway umount`, else `fusermount3 -u -z`).
struct DemoMount {
    bin: PathBuf,
    path: PathBuf,
    pid: Option<u32>,
}

impl DemoMount {
    /// Unmounts and waits (bounded) for the serving process to flush, sync and exit.
    fn unmount(mut self) -> anyhow::Result<()> {
        let status = Command::new(&self.bin)
            .arg("umount")
            .arg(&self.path)
            .status()
            .context("running spillway umount")?;
        if !status.success() {
            bail!("spillway umount {} failed ({status})", self.path.display());
        }
        if let Some(pid) = self.pid.take() {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.path = PathBuf::new();
        Ok(())
    }
}

impl Drop for DemoMount {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let unmounted = Command::new(&self.bin)
            .arg("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.path).status();
        }
    }
}

/// `spillway mount --background` of the demo's servers at `path`.
fn demo_mount(
    bin: &Path,
    endpoints: &[Endpoint],
    path: &Path,
    log: &Path,
) -> anyhow::Result<DemoMount> {
    let servers = endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(",");
    let out = Command::new(bin)
        .args(["mount", "--servers", &servers, "--background", "--log"])
        .arg(log)
        .arg(path)
        .output()
        .context("running spillway mount")?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        bail!(
            "spillway mount failed: {said} {}{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            log_tail(log)
        );
    }
    println!("   {said}");
    let pid =
        said.rsplit_once("(pid ").and_then(|(_, rest)| rest.trim_end_matches(')').parse().ok());
    Ok(DemoMount { bin: bin.to_path_buf(), path: path.to_path_buf(), pid })
}

fn shell(script: &str) -> anyhow::Result<()> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .with_context(|| format!("running {script}"))?;
    if !out.status.success() {
        bail!(
            "`{script}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Step 7: unmodified programs (cp, dd, Python) write through the FUSE mount; the files are
/// read back, survive an unmount and show up again on a second mount.
pub(crate) fn mount_step(bin: &Path, endpoints: &[Endpoint], root: &Path) -> anyhow::Result<()> {
    println!("7. Unmodified programs through the POSIX mount (`spillway mount`, FUSE)");
    if !Path::new("/dev/fuse").exists() {
        println!("   skipped: /dev/fuse is absent on this machine (load the fuse module to see this step)");
        println!();
        return Ok(());
    }
    let mnt = root.join("mnt");
    std::fs::create_dir(&mnt).with_context(|| format!("creating {}", mnt.display()))?;
    let input = root.join("input.bin");
    std::fs::write(&input, rank_data(EpochId(99), 0, 3 * MIB + 4321))
        .context("writing the demo input")?;
    let mount = demo_mount(bin, endpoints, &mnt, &root.join("mount.log"))?;
    let (i, m) = (input.display(), mnt.display());
    let started = Instant::now();
    shell(&format!("mkdir -p {m}/results && cp {i} {m}/results/copy.bin && dd if={i} of={m}/results/dd.bin bs=1M conv=fsync status=none"))?;
    println!(
        "   cp and dd (conv=fsync) wrote {} twice in {:.0} ms",
        format_bytes(3 * MIB + 4321),
        started.elapsed().as_secs_f64() * 1e3
    );
    let python = "import os, sys\nwith open(sys.argv[1], 'w') as f:\n    f.write('written by Python through the mount\\n')\n    f.flush()\n    os.fsync(f.fileno())\n";
    match Command::new("python3").arg("-c").arg(python).arg(mnt.join("results/python.txt")).status()
    {
        Ok(status) if status.success() => {
            println!("   python3 wrote and fsync'd results/python.txt")
        }
        Ok(status) => bail!("python3 writing through the mount failed ({status})"),
        Err(_) => println!("   (python3 not found: Python part skipped)"),
    }
    shell(&format!("cmp {i} {m}/results/copy.bin && cmp {i} {m}/results/dd.bin"))?;
    let listing = Command::new("ls").arg("-l").arg(mnt.join("results")).output().context("ls")?;
    for line in String::from_utf8_lossy(&listing.stdout).lines() {
        println!("   | {line}");
    }
    mount.unmount()?;
    println!("   unmounted; mounting again shows the same files (metadata on bb0, bytes striped over both servers):");
    let mount = demo_mount(bin, endpoints, &mnt, &root.join("mount.log"))?;
    shell(&format!("cmp {i} {m}/results/copy.bin && cmp {i} {m}/results/dd.bin"))?;
    if mnt.join("results/python.txt").exists() {
        let text = std::fs::read_to_string(mnt.join("results/python.txt"))
            .context("reading results/python.txt back")?;
        println!(
            "   read back: copy.bin and dd.bin identical to the input; python.txt says {:?}",
            text.trim()
        );
    } else {
        println!("   read back: copy.bin and dd.bin identical to the input");
    }
    mount.unmount()?;
    println!();
    Ok(())
}
