//! `libspillway_preload.so` end to end: real `spillway serve` processes, unmodified programs
//! (cp, dd, cat, bash, Python) run with `LD_PRELOAD`, and a real FUSE mount of the same
//! namespace to check what they did — or, for the cases "without a mount", a plain directory as
//! the mount point, so that any call the library failed to intercept lands visibly in that
//! directory instead of on the burst buffer.
//!
//! The mount's suites (`mount_suite`: POSIX conformance, random operations against a plain
//! directory, unmodified tools) also run under the library: the test binary starts itself
//! again with `LD_PRELOAD` set and runs the suite in that child (`suite_child`).

mod mount_suite;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{MountGuard, ServerProcess, TestUser};
use spillway_mount::MountConfig;
use spillway_namespace::Namespace;
use spillway_proto::Endpoint;
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// Servers, a namespace on the first one, and what a preloaded program needs to reach them.
struct Setup {
    dir: tempfile::TempDir,
    _servers: Vec<ServerProcess>,
    endpoints: Vec<Endpoint>,
    namespace_id: u64,
    library: PathBuf,
}

impl Setup {
    fn new(namespace_id: u64) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        // The test user of the permission case must reach the directories.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (servers, endpoints) = spillway_harness::start_servers(BIN, dir.path(), 2, "64M");
        let setup = Setup {
            dir,
            _servers: servers,
            endpoints,
            namespace_id,
            library: spillway_harness::preload_library(),
        };
        drop(setup.namespace()); // created: root-owned, mode 1777 (as `spillway mount` makes it)
        setup
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn namespace(&self) -> Arc<dyn Namespace> {
        let options = RemoteOptions {
            create: true,
            data_epoch: EpochId(1_000_000 + self.namespace_id),
            root_mode: 0o1777,
            ..RemoteOptions::default()
        };
        Arc::new(RemoteNamespace::open(&self.endpoints[0], self.namespace_id, &options).unwrap())
    }

    /// The namespace mounted through FUSE at `path`.
    fn mount(&self, path: &Path) -> MountGuard {
        spillway_harness::require_fuse("the preload tests mount FUSE: they");
        std::fs::create_dir_all(path).unwrap();
        let config = MountConfig::default();
        let clients = (0..config.threads)
            .map(|_| {
                let options =
                    ClientOptions { placement: Placement::striped_default(), ..Default::default() };
                Client::connect(&self.endpoints, options).unwrap()
            })
            .collect();
        let mount = spillway_mount::mount(self.namespace(), clients, path, config).unwrap();
        MountGuard::new(path, move || mount.unmount().map_err(|e| e.to_string()))
    }

    /// `command` set up to run under the library with `mountpoint` as its mount point.
    fn preloaded<'a>(&self, command: &'a mut Command, mountpoint: &Path) -> &'a mut Command {
        command
            .env("LD_PRELOAD", &self.library)
            .env("SPILLWAY_PRELOAD_MOUNT", mountpoint)
            .env("SPILLWAY_PRELOAD_SERVERS", spillway_harness::endpoint_list(&self.endpoints))
            .env("SPILLWAY_PRELOAD_NAMESPACE", self.namespace_id.to_string())
            .env("SPILLWAY_PRELOAD_NAMESPACE_SERVER", "0")
    }

    /// `bash -c script` under the library; its output, asserted successful.
    fn bash(&self, mountpoint: &Path, script: &str) -> String {
        let output = self
            .preloaded(Command::new("bash").arg("-c").arg(script), mountpoint)
            .output()
            .unwrap();
        succeeded(&output, script)
    }
}

fn succeeded(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Entries of a plain directory (the unmounted mount point): what escaped the library.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

const PYTHON_FILES: &str = r#"
import os, sys
root = sys.argv[1]
p = os.path.join(root, "py.txt")
with open(p, "w") as f:
    f.write("hello\n")
with open(p, "a") as f:
    f.write("world\n")
assert open(p).read() == "hello\nworld\n", open(p).read()
assert os.stat(p).st_size == 12
with open(p, "r+b") as f:
    f.seek(6); f.write(b"WORLD"); f.seek(0, 2); assert f.tell() == 12
    f.truncate(8)
assert open(p, "rb").read() == b"hello\nWO", open(p, "rb").read()
os.mkdir(os.path.join(root, "d"))
os.rename(p, os.path.join(root, "d", "moved.txt"))
assert not os.path.exists(p)
assert os.path.exists(os.path.join(root, "d", "moved.txt"))
fd = os.open(os.path.join(root, "d", "gone"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
os.write(fd, b"x" * 100000)
os.fsync(fd)
os.close(fd)
assert os.stat(os.path.join(root, "d", "gone")).st_mode & 0o777 == 0o600
os.unlink(os.path.join(root, "d", "gone"))
try:
    os.open(os.path.join(root, "d", "moved.txt"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    sys.exit("O_EXCL on an existing file succeeded")
except FileExistsError:
    pass
print("python ok")
"#;

#[test]
fn tools_through_the_library_without_a_mount_reach_the_burst_buffer() {
    let setup = Setup::new(11);
    let unmounted = setup.path("unmounted");
    std::fs::create_dir(&unmounted).unwrap();
    let source = setup.path("source.bin");
    std::fs::write(&source, spillway_harness::pattern(7, 5_000_000)).unwrap();
    let out = setup.bash(
        &unmounted,
        &format!(
            "cp {src} {m}/cp.bin && dd if={m}/cp.bin of={m}/dd.bin bs=16k status=none && \
             cat {m}/dd.bin > {copy} && cmp {src} {copy} && stat -c %s {m}/dd.bin",
            src = source.display(),
            m = unmounted.display(),
            copy = setup.path("back.bin").display()
        ),
    );
    assert_eq!(out.trim(), "5000000");
    let python = setup
        .preloaded(Command::new("python3").args(["-c", PYTHON_FILES]).arg(&unmounted), &unmounted)
        .output()
        .unwrap();
    assert_eq!(succeeded(&python, "python").trim(), "python ok");
    // Every call was the library's: nothing reached the plain directory.
    assert!(
        entries(&unmounted).is_empty(),
        "escaped to the plain directory: {:?}",
        entries(&unmounted)
    );
    // The burst buffer holds it all, as any mount of the namespace shows.
    let mount = setup.mount(&setup.path("mnt"));
    let want = std::fs::read(&source).unwrap();
    assert!(std::fs::read(mount.path().join("cp.bin")).unwrap() == want, "cp.bin");
    assert!(std::fs::read(mount.path().join("dd.bin")).unwrap() == want, "dd.bin");
    assert_eq!(std::fs::read(mount.path().join("d/moved.txt")).unwrap(), b"hello\nWO");
    assert!(!mount.path().join("d/gone").exists());
}

#[test]
fn shells_and_forks_share_offsets_through_the_mount() {
    let setup = Setup::new(12);
    let mount = setup.mount(&setup.path("mnt"));
    let m = mount.path().display().to_string();
    // bash's builtins write standard output with stdio (calls no preload library sees), and
    // the external echos are children: the file must hold all four lines in order.
    let out = setup.bash(
        mount.path(),
        &format!(
            "{{ echo first; /bin/echo a; /bin/echo b; echo last; }} > {m}/sh.txt; cat {m}/sh.txt"
        ),
    );
    assert_eq!(out, "first\na\nb\nlast\n");
    assert_eq!(
        std::fs::read_to_string(mount.path().join("sh.txt")).unwrap(),
        "first\na\nb\nlast\n"
    );
    // A forked child writes through the parent's descriptor at the shared offset.
    let program = r#"
import os, sys
f = open(sys.argv[1], "w"); f.write("parent\n"); f.flush()
pid = os.fork()
if pid == 0:
    os.write(f.fileno(), b"child\n"); os._exit(0)
os.waitpid(pid, 0); f.write("parent2\n"); f.close()
print(open(sys.argv[1]).read(), end="")
"#;
    let fork = setup
        .preloaded(
            Command::new("python3").args(["-c", program]).arg(mount.path().join("fork.txt")),
            mount.path(),
        )
        .output()
        .unwrap();
    assert_eq!(succeeded(&fork, "fork"), "parent\nchild\nparent2\n");
}

#[test]
fn a_new_program_without_a_mount_gets_ebadf_on_an_inherited_descriptor_never_wrong_bytes() {
    let setup = Setup::new(13);
    let unmounted = setup.path("unmounted");
    std::fs::create_dir(&unmounted).unwrap();
    let program = r#"
import os, subprocess, sys
path = os.path.join(sys.argv[1], "x")
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"parent\n")
os.set_inheritable(fd, True)
with_library = subprocess.run(["/bin/sh", "-c", "echo child >&%d" % fd], pass_fds=[fd], capture_output=True)
without = subprocess.run(["env", "-u", "LD_PRELOAD", "/bin/sh", "-c", "echo child >&%d" % fd], pass_fds=[fd], capture_output=True)
os.close(fd)
# dash reports the EBADF of its write as "I/O error"; what matters is that it failed.
print(with_library.returncode != 0, without.returncode != 0)
print(open(path).read(), end="")
"#;
    let out = setup
        .preloaded(Command::new("python3").args(["-c", program]).arg(&unmounted), &unmounted)
        .output()
        .unwrap();
    assert_eq!(succeeded(&out, "inherit"), "True True\nparent\n");
    assert!(entries(&unmounted).is_empty(), "{:?}", entries(&unmounted));
}

#[test]
fn another_user_cannot_read_or_replace_a_private_file_through_the_library() {
    let setup = Setup::new(14);
    let mount = setup.mount(&setup.path("mnt"));
    let secret = mount.path().join("secret");
    std::fs::write(&secret, "root's data\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let user = TestUser::create("spwpreload").unwrap();
    let attempts = format!(
        "cat {s}; echo rc=$?; echo stolen > {s}; echo rc=$?; rm -f {s}; echo rc=$?; \
         mv {s} {m}/mine; echo rc=$?",
        s = secret.display(),
        m = mount.path().display()
    );
    let mut command = user.command("bash");
    command.arg("-c").arg(&attempts);
    let output = setup.preloaded(&mut command, mount.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stdout.contains("root's data"), "{stdout}");
    assert_eq!(stdout.matches("rc=1").count(), 4, "every attempt fails: {stdout}\n{stderr}");
    assert!(
        stderr.contains("Permission denied") || stderr.contains("Operation not permitted"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's data\n");
}

/// The suites of `mount_suite` in a child of this binary under the library (the parent holds
/// the servers and the mount; the child does the calls).
fn run_suite_under_library(suite: &str, namespace_id: u64) {
    let setup = Setup::new(namespace_id);
    let mount = setup.mount(&setup.path("mnt"));
    let scratch = setup.path("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let root = mount.path().join("suite");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "suite_child", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("SPILLWAY_PRELOAD_SUITE", suite)
        .env("SPILLWAY_PRELOAD_SUITE_ROOT", &root)
        .env("SPILLWAY_PRELOAD_SUITE_SCRATCH", &scratch);
    let output = setup.preloaded(&mut command, mount.path()).output().unwrap();
    let out = succeeded(&output, suite);
    assert!(out.contains("1 passed"), "the child ran no suite: {out}");
    println!("{out}");
}

#[test]
fn conformance_under_the_library() {
    run_suite_under_library("conformance", 21);
}

#[test]
fn random_operations_under_the_library_match_a_plain_directory() {
    run_suite_under_library("random", 22);
}

#[test]
fn unmodified_tools_under_the_library() {
    run_suite_under_library("tools", 23);
}

/// Run by [`run_suite_under_library`] in a child with `LD_PRELOAD` set.
#[test]
#[ignore = "run by the suite tests of this file, under the library"]
fn suite_child() {
    let suite = std::env::var("SPILLWAY_PRELOAD_SUITE").expect("run by run_suite_under_library");
    assert!(std::env::var_os("LD_PRELOAD").is_some(), "the suite child runs under the library");
    let root = PathBuf::from(std::env::var("SPILLWAY_PRELOAD_SUITE_ROOT").unwrap());
    let scratch = PathBuf::from(std::env::var("SPILLWAY_PRELOAD_SUITE_SCRATCH").unwrap());
    match suite.as_str() {
        "conformance" => {
            let (passed, total, failures) = mount_suite::conformance(&root);
            println!("POSIX conformance under the library: {passed}/{total} cases passed");
            assert!(
                failures.is_empty(),
                "{} of {total} failed:\n{}",
                failures.len(),
                failures.join("\n")
            );
        }
        "random" => {
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            println!("random operations seed {seed}");
            let steps =
                mount_suite::random_ops(&root.join("r"), &scratch.join("plain"), seed, 2_000)
                    .unwrap_or_else(|e| panic!("{e}\nseed {seed}"));
            println!("{steps} random steps agreed");
        }
        "tools" => mount_suite::tools(&root, &scratch).unwrap(),
        other => panic!("no suite {other}"),
    }
}

#[test]
fn the_environment_printed_by_spillway_mount_reaches_the_namespace_it_would_mount() {
    let setup = Setup::new(15);
    let unmounted = setup.path("unmounted");
    std::fs::create_dir(&unmounted).unwrap();
    let printed = Command::new(BIN)
        .args(["mount", "--servers", &spillway_harness::endpoint_list(&setup.endpoints)])
        .args(["--namespace-id", "15", "--print-preload-env"])
        .arg(&unmounted)
        .output()
        .unwrap();
    let environment = succeeded(&printed, "--print-preload-env");
    assert!(environment.contains("export SPILLWAY_PRELOAD_NAMESPACE='15'"), "{environment}");
    // Nothing was mounted.
    assert!(!std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .contains(unmounted.to_str().unwrap()));
    let script = format!(
        "{environment}\nexport LD_PRELOAD='{}'\n\
         echo through the printed environment | dd of={}/e.txt status=none",
        setup.library.display(),
        unmounted.display()
    );
    let output = Command::new("bash").arg("-c").arg(&script).output().unwrap();
    succeeded(&output, &script);
    assert!(entries(&unmounted).is_empty(), "{:?}", entries(&unmounted));
    let mount = setup.mount(&setup.path("mnt"));
    assert_eq!(
        std::fs::read_to_string(mount.path().join("e.txt")).unwrap(),
        "through the printed environment\n"
    );
}

#[test]
fn an_mpi_checkpoint_under_the_library_reaches_the_burst_buffer() {
    let setup = Setup::new(16);
    let unmounted = setup.path("unmounted");
    std::fs::create_dir(&unmounted).unwrap();
    // The program of the multi-node Slurm test (N-1 and N-N checkpoints, every byte checked by
    // rank 0), compiled with Debian's mpicc, two ranks, only the ranks under the library.
    let program = setup.path("checkpoint");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/mpi/checkpoint.c");
    let compiled = Command::new("mpicc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&program)
        .arg(&source)
        .output()
        .expect("mpicc (Debian's libopenmpi-dev, installed by make deps)");
    succeeded(&compiled, "mpicc");
    let input_bytes = 3 * 1024 * 1024 + 17;
    let input = setup.path("input.bin");
    let input_data: Vec<u8> =
        (0..input_bytes as u64).map(|o| ((o * 13 + 5 + (o >> 10)) & 0xff) as u8).collect();
    std::fs::write(&input, input_data).unwrap();
    let servers = spillway_harness::endpoint_list(&setup.endpoints);
    let output = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg("-x")
        .arg(format!("LD_PRELOAD={}", setup.library.display()))
        .arg("-x")
        .arg(format!("SPILLWAY_PRELOAD_MOUNT={}", unmounted.display()))
        .arg("-x")
        .arg(format!("SPILLWAY_PRELOAD_SERVERS={servers}"))
        .args(["-x", "SPILLWAY_PRELOAD_NAMESPACE=16"])
        .arg(&program)
        .arg(&input)
        .arg(input_bytes.to_string())
        .arg(unmounted.join("ckpt"))
        .arg((2 * 1024 * 1024 + 3).to_string())
        .env("OMPI_MCA_plm_rsh_agent", "")
        .output()
        .unwrap();
    let out = succeeded(&output, "mpirun checkpoint");
    assert!(out.contains("checkpoint ok"), "{out}");
    assert!(entries(&unmounted).is_empty(), "escaped: {:?}", entries(&unmounted));
    let mount = setup.mount(&setup.path("mnt"));
    let n1 = std::fs::metadata(mount.path().join("ckpt/n1.ckpt")).unwrap();
    assert_eq!(n1.len(), 2 * (2 * 1024 * 1024 + 3));
    assert_eq!(std::fs::read_dir(mount.path().join("ckpt/nn")).unwrap().count(), 2);
}

#[test]
fn threads_of_one_program_share_files_through_the_library() {
    let setup = Setup::new(17);
    let unmounted = setup.path("unmounted");
    std::fs::create_dir(&unmounted).unwrap();
    // 8 threads: each pwrites its stripes of one shared file through one descriptor and writes
    // a file of its own, while the others do the same; then every byte is checked.
    let program = r#"
import os, sys, threading
root = sys.argv[1]
shared = os.open(os.path.join(root, "shared"), os.O_RDWR | os.O_CREAT, 0o644)
piece = 65536
def work(t):
    for i in range(32):
        os.pwrite(shared, bytes([t + 1]) * piece, (i * 8 + t) * piece)
    with open(os.path.join(root, "own.%d" % t), "wb") as f:
        for i in range(16):
            f.write(bytes([t + 101]) * 100000)
threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
for t in threads: t.start()
for t in threads: t.join()
os.fsync(shared)
for i in range(32 * 8):
    assert os.pread(shared, piece, i * piece) == bytes([i % 8 + 1]) * piece, i
os.close(shared)
for t in range(8):
    assert open(os.path.join(root, "own.%d" % t), "rb").read() == bytes([t + 101]) * 1600000, t
print("threads ok")
"#;
    let output = setup
        .preloaded(Command::new("python3").args(["-c", program]).arg(&unmounted), &unmounted)
        .output()
        .unwrap();
    assert_eq!(succeeded(&output, "threads").trim(), "threads ok");
    assert!(entries(&unmounted).is_empty(), "escaped: {:?}", entries(&unmounted));
    let mount = setup.mount(&setup.path("mnt"));
    assert_eq!(std::fs::metadata(mount.path().join("shared")).unwrap().len(), 32 * 8 * 65536);
}

#[test]
fn bad_settings_or_unreachable_servers_are_named_and_calls_go_to_the_file_system() {
    let library = spillway_harness::preload_library();
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.txt");
    std::fs::write(&plain, "plain bytes\n").unwrap();
    for (settings, said) in [
        (vec![("SPILLWAY_PRELOAD_MOUNT", "relative/path")], "is not an absolute path"),
        (vec![("SPILLWAY_PRELOAD_MOUNT", "/")], "the root directory cannot be a mount point"),
        (
            vec![("SPILLWAY_PRELOAD_MOUNT", dir.path().to_str().unwrap())],
            "SPILLWAY_PRELOAD_SERVERS is not set",
        ),
        (
            vec![
                ("SPILLWAY_PRELOAD_MOUNT", dir.path().to_str().unwrap()),
                ("SPILLWAY_PRELOAD_SERVERS", "127.0.0.1:1"),
            ],
            "calls go to the file system",
        ),
    ] {
        let mut command = Command::new("cat");
        command.arg(&plain).env("LD_PRELOAD", &library).envs(settings.iter().copied());
        let output = command.output().unwrap();
        // The program works on the file system as without the library, and is told why.
        assert_eq!(succeeded(&output, "cat"), "plain bytes\n", "{settings:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(said), "{settings:?}: {stderr}");
        assert_eq!(stderr.matches("libspillway_preload").count(), 1, "said once: {stderr}");
    }
}

#[test]
fn directories_list_through_the_library_with_and_without_a_mount() {
    let setup = Setup::new(18);
    let unmounted = setup.path("unmounted");
    std::fs::create_dir(&unmounted).unwrap();
    // Without a mount: listings, stats of every entry, and walks are the library's alone.
    let program = r#"
import os, sys
root = sys.argv[1]
os.makedirs(os.path.join(root, "d", "e"))
for i in range(300):
    open(os.path.join(root, "d", "f%03d" % i), "w").write("x" * i)
names = sorted(os.listdir(os.path.join(root, "d")))
assert names == ["e"] + ["f%03d" % i for i in range(300)], names[:5]
sizes = {e.name: e.stat().st_size for e in os.scandir(os.path.join(root, "d")) if e.is_file()}
assert sizes == {"f%03d" % i: i for i in range(300)}
walked = [(d, sorted(s), len(f)) for d, s, f in os.walk(root)]
assert walked == [(root, ["d"], 0), (os.path.join(root, "d"), ["e"], 300), (os.path.join(root, "d", "e"), [], 0)], walked
print("listed")
"#;
    let out = setup
        .preloaded(Command::new("python3").args(["-c", program]).arg(&unmounted), &unmounted)
        .output()
        .unwrap();
    assert_eq!(succeeded(&out, "python listing").trim(), "listed");
    let listing = setup.bash(&unmounted, &format!("ls -la {}/d | wc -l", unmounted.display()));
    assert_eq!(listing.trim(), "304", "total, ., .., e and 300 files");
    assert!(entries(&unmounted).is_empty(), "escaped: {:?}", entries(&unmounted));
    // With the mount: find and rm -r (which change directory through it) over the same tree.
    let mount = setup.mount(&setup.path("mnt"));
    let m = mount.path().display().to_string();
    let found = setup.bash(
        mount.path(),
        &format!("find {m}/d | wc -l; find {m}/d -type f -printf '%s\\n' | awk '{{s+=$1}} END {{print s}}'"),
    );
    assert_eq!(found, format!("302\n{}\n", (0..300).sum::<u64>()));
    setup.bash(mount.path(), &format!("rm -r {m}/d"));
    assert!(!mount.path().join("d").exists());
}

#[test]
fn a_directory_another_client_replaced_is_found_again_not_served_from_the_cache() {
    let setup = Setup::new(19);
    let mount = setup.mount(&setup.path("mnt"));
    // One process under the library walks d (caching it), then another client (the mount,
    // without the library) removes d and makes a new one with the same name and a new file:
    // the library's next calls find the new directory, though its cache still names the old.
    let program = r#"
import os, subprocess, sys
root = sys.argv[1]
os.makedirs(os.path.join(root, "d"))
open(os.path.join(root, "d", "f"), "w").write("old")
assert open(os.path.join(root, "d", "f")).read() == "old"
script = "rm -r {0}/d && mkdir {0}/d && printf new > {0}/d/f && printf other > {0}/d/g".format(root)
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
subprocess.run(["sh", "-c", script], env=env, check=True)
print(open(os.path.join(root, "d", "f")).read())
print(os.stat(os.path.join(root, "d", "g")).st_size)
open(os.path.join(root, "d", "h"), "w").write("mine")
print(sorted(os.listdir(os.path.join(root, "d"))))
"#;
    let output = setup
        .preloaded(Command::new("python3").args(["-c", program]).arg(mount.path()), mount.path())
        .output()
        .unwrap();
    assert_eq!(succeeded(&output, "replaced directory"), "new\n5\n['f', 'g', 'h']\n");
    assert_eq!(std::fs::read_to_string(mount.path().join("d/h")).unwrap(), "mine");
}
