//! Seeded model test: random operations on `LocalNamespace` and on a deliberately different,
//! path-based reference model, comparing every result (errno included) and, periodically, the
//! whole tree (kinds, sizes, link counts, which paths share an inode). Seeds are printed;
//! `SPILLWAY_MODEL_SEED=N` replays one.

use std::collections::{BTreeMap, HashMap};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spillway_meta::*;
use spillway_namespace::*;

use crate::{capacity, clock, config, options, root};

type Path = Vec<&'static str>;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    /// A regular file (or symlink, `symlink` set) with a model identity shared by hard links.
    File {
        id: u64,
        symlink: bool,
    },
}

#[derive(Default)]
struct Model {
    nodes: BTreeMap<Path, Node>,
    sizes: HashMap<u64, u64>,
    next_id: u64,
}

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

impl Model {
    fn get(&self, path: &[&'static str]) -> Option<&Node> {
        if path.is_empty() {
            return Some(&Node::Dir);
        }
        self.nodes.get(path)
    }

    /// Errors of walking to the parent of `path` by lookups (the parent itself may be a file:
    /// that is found by the operation on it).
    fn walk(&self, path: &[&'static str]) -> Result<(), i32> {
        for i in 1..path.len() {
            match self.get(&path[..i]) {
                None => return Err(libc::ENOENT),
                Some(Node::File { .. }) if i + 1 < path.len() => return Err(libc::ENOTDIR),
                _ => {}
            }
        }
        Ok(())
    }

    /// ENOTDIR if the parent of `path` is not a directory.
    fn parent_is_directory(&self, path: &[&'static str]) -> Result<(), i32> {
        match self.get(&path[..path.len() - 1]) {
            Some(Node::Dir) => Ok(()),
            _ => Err(libc::ENOTDIR),
        }
    }

    /// Walk to the parent, and the parent is a directory.
    fn parent_ok(&self, path: &[&'static str]) -> Result<(), i32> {
        self.walk(path)?;
        self.parent_is_directory(path)
    }

    fn resolve(&self, path: &[&'static str]) -> Result<&Node, i32> {
        self.parent_ok(path)?;
        self.get(path).ok_or(libc::ENOENT)
    }

    fn children(&self, path: &[&'static str]) -> Vec<Path> {
        self.nodes
            .keys()
            .filter(|p| p.len() == path.len() + 1 && p.starts_with(path))
            .cloned()
            .collect()
    }

    fn add(&mut self, path: &[&'static str], node: Node) -> Result<(), i32> {
        self.parent_ok(path)?;
        if self.get(path).is_some() {
            return Err(libc::EEXIST);
        }
        self.nodes.insert(path.to_vec(), node);
        Ok(())
    }

    fn new_file(&mut self, symlink: bool) -> Node {
        self.next_id += 1;
        let size = if symlink { 1 } else { 0 };
        self.sizes.insert(self.next_id, size);
        Node::File { id: self.next_id, symlink }
    }

    fn unlink(&mut self, path: &[&'static str]) -> Result<(), i32> {
        match self.resolve(path)? {
            Node::Dir => Err(libc::EISDIR),
            Node::File { .. } => {
                self.nodes.remove(path);
                Ok(())
            }
        }
    }

    fn rmdir(&mut self, path: &[&'static str]) -> Result<(), i32> {
        match self.resolve(path)? {
            Node::File { .. } => Err(libc::ENOTDIR),
            Node::Dir if !self.children(path).is_empty() => Err(libc::ENOTEMPTY),
            Node::Dir => {
                self.nodes.remove(path);
                Ok(())
            }
        }
    }

    fn link(&mut self, source: &[&'static str], target: &[&'static str]) -> Result<(), i32> {
        let node = self.resolve(source)?.clone();
        self.parent_ok(target)?;
        if node == Node::Dir {
            return Err(libc::EPERM);
        }
        self.add(target, node)
    }

    /// Moves the subtree at `from` to `to` (which must be free).
    fn move_subtree(&mut self, from: &[&'static str], to: &[&'static str]) {
        let moved: Vec<Path> = self.nodes.keys().filter(|p| p.starts_with(from)).cloned().collect();
        let mut taken = Vec::new();
        for path in moved {
            let node = self.nodes.remove(&path).unwrap();
            let mut new_path = to.to_vec();
            new_path.extend_from_slice(&path[from.len()..]);
            taken.push((new_path, node));
        }
        for (path, node) in taken {
            assert!(self.nodes.insert(path, node).is_none());
        }
    }

    fn rename(
        &mut self,
        source: &[&'static str],
        target: &[&'static str],
        flags: u32,
    ) -> Result<(), i32> {
        self.walk(source)?;
        self.walk(target)?;
        self.parent_is_directory(source)?;
        self.parent_is_directory(target)?;
        let source_node = self.get(source).cloned().ok_or(libc::ENOENT)?;
        let target_node = self.get(target).cloned();
        let exchange = flags & RENAME_EXCHANGE != 0;
        if exchange && target_node.is_none() {
            return Err(libc::ENOENT);
        }
        if flags & RENAME_NOREPLACE != 0 && target_node.is_some() {
            return Err(libc::EEXIST);
        }
        let (source_parent, target_parent) =
            (&source[..source.len() - 1], &target[..target.len() - 1]);
        let same_parent = source_parent == target_parent;
        if source_node == Node::Dir && !same_parent && target_parent.starts_with(source) {
            return Err(libc::EINVAL);
        }
        if target_node == Some(Node::Dir) && !same_parent && source_parent.starts_with(target) {
            return Err(if exchange { libc::EINVAL } else { libc::ENOTEMPTY });
        }
        if source == target
            || matches!((&source_node, &target_node), (Node::File { id: a, .. }, Some(Node::File { id: b, .. })) if a == b)
        {
            return Ok(());
        }
        if exchange {
            let parked: Path = vec!["\u{0}parked"];
            self.move_subtree(source, &parked);
            self.move_subtree(target, source);
            self.move_subtree(&parked, target);
            return Ok(());
        }
        match (&source_node, &target_node) {
            (Node::Dir, Some(Node::File { .. })) => return Err(libc::ENOTDIR),
            (Node::File { .. }, Some(Node::Dir)) => return Err(libc::EISDIR),
            (Node::Dir, Some(Node::Dir)) if !self.children(target).is_empty() => {
                return Err(libc::ENOTEMPTY)
            }
            _ => {}
        }
        self.nodes.remove(target);
        self.move_subtree(source, target);
        Ok(())
    }

    fn resize(&mut self, path: &[&'static str], size: u64, grow_only: bool) -> Result<(), i32> {
        match self.resolve(path)?.clone() {
            Node::Dir => Err(if grow_only { libc::EINVAL } else { libc::EISDIR }),
            Node::File { symlink: true, .. } => Err(libc::EINVAL),
            Node::File { id, .. } => {
                let current = self.sizes[&id];
                self.sizes.insert(id, if grow_only { current.max(size) } else { size });
                Ok(())
            }
        }
    }
}

/// Resolves a path on the namespace the way the mount does: one lookup per component.
fn resolve(ns: &dyn Namespace, path: &[&str]) -> Result<Ino, i32> {
    let mut ino = ROOT_INO;
    for name in path {
        ino = ns.lookup(&root(), ino, name.as_bytes()).map_err(|e| e.errno)?.ino;
    }
    Ok(ino)
}

fn parent_and_name<'a>(ns: &dyn Namespace, path: &[&'a str]) -> Result<(Ino, &'a [u8]), i32> {
    let parent = resolve(ns, &path[..path.len() - 1])?;
    Ok((parent, path[path.len() - 1].as_bytes()))
}

fn random_path(rng: &mut ChaCha8Rng) -> Path {
    let depth = rng.gen_range(1..=3);
    (0..depth).map(|_| NAMES[rng.gen_range(0..NAMES.len())]).collect()
}

fn errno_of<T>(result: Result<T, MetaError>) -> Result<(), i32> {
    result.map(|_| ()).map_err(|e| e.errno)
}

/// Runs one random step on both; returns a description for failure messages.
fn step(ns: &dyn Namespace, model: &mut Model, rng: &mut ChaCha8Rng) -> String {
    let path = random_path(rng);
    let other = random_path(rng);
    let op = rng.gen_range(0..100);
    let (description, real, expected) = match op {
        0..=19 => {
            let real = parent_and_name(ns, &path).and_then(|(p, n)| {
                errno_of(ns.create(&root(), p, n, FileKind::Regular, 0o644, 0, 0, true))
            });
            let node = model.new_file(false);
            (format!("create {path:?}"), real, model.add(&path, node))
        }
        20..=34 => {
            let real = parent_and_name(ns, &path)
                .and_then(|(p, n)| errno_of(ns.mkdir(&root(), p, n, 0o755, 0)));
            (format!("mkdir {path:?}"), real, model.add(&path, Node::Dir))
        }
        35..=39 => {
            let real = parent_and_name(ns, &path)
                .and_then(|(p, n)| errno_of(ns.symlink(&root(), p, n, b"x")));
            let node = model.new_file(true);
            (format!("symlink {path:?}"), real, model.add(&path, node))
        }
        40..=49 => {
            let real =
                parent_and_name(ns, &path).and_then(|(p, n)| errno_of(ns.unlink(&root(), p, n)));
            (format!("unlink {path:?}"), real, model.unlink(&path))
        }
        50..=57 => {
            let real =
                parent_and_name(ns, &path).and_then(|(p, n)| errno_of(ns.rmdir(&root(), p, n)));
            (format!("rmdir {path:?}"), real, model.rmdir(&path))
        }
        58..=64 => {
            let real = resolve(ns, &path)
                .and_then(|source| parent_and_name(ns, &other).map(|(p, n)| (source, p, n)))
                .and_then(|(source, p, n)| errno_of(ns.link(&root(), source, p, n)));
            (format!("link {path:?} {other:?}"), real, model.link(&path, &other))
        }
        65..=84 => {
            let flags = [0, 0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE][rng.gen_range(0..5)];
            let real = parent_and_name(ns, &path)
                .and_then(|(p, n)| parent_and_name(ns, &other).map(|(q, m)| (p, n, q, m)))
                .and_then(|(p, n, q, m)| errno_of(ns.rename(&root(), p, n, q, m, flags)));
            (
                format!("rename {path:?} {other:?} flags {flags}"),
                real,
                model.rename(&path, &other, flags),
            )
        }
        85..=94 => {
            let end = rng.gen_range(0..1 << 20);
            let real = resolve(ns, &path).and_then(|ino| errno_of(ns.wrote(&root(), ino, end)));
            (format!("wrote {path:?} {end}"), real, model.resize(&path, end, true))
        }
        _ => {
            let size = rng.gen_range(0..1 << 16);
            let set = SetAttr { size: Some(size), ..SetAttr::default() };
            let real = resolve(ns, &path).and_then(|ino| errno_of(ns.setattr(&root(), ino, &set)));
            (format!("truncate {path:?} {size}"), real, model.resize(&path, size, false))
        }
    };
    assert_eq!(real, expected, "{description}");
    description
}

/// Compares the whole tree: same paths and kinds, sizes, link counts, shared inodes.
fn compare(ns: &dyn Namespace, model: &Model) {
    let tree = crate::recovery::tree(ns);
    let real_paths: Vec<String> = tree.iter().map(|(p, _, _)| p.clone()).collect();
    let model_paths: Vec<String> =
        model.nodes.keys().map(|p| format!("/{}", p.join("/"))).collect();
    let mut sorted_model = model_paths.clone();
    sorted_model.sort();
    assert_eq!(real_paths, sorted_model);
    let mut identity: HashMap<u64, Ino> = HashMap::new();
    for (path, attr, _) in &tree {
        let components: Vec<&str> = path[1..].split('/').collect();
        let key: Vec<&'static str> =
            components.iter().map(|c| *NAMES.iter().find(|n| *n == c).unwrap()).collect();
        match &model.nodes[&key] {
            Node::Dir => {
                assert_eq!(attr.kind, FileKind::Directory, "{path}");
                let subdirs =
                    model.children(&key).iter().filter(|c| model.nodes[*c] == Node::Dir).count()
                        as u32;
                assert_eq!(attr.nlink, 2 + subdirs, "{path}");
            }
            Node::File { id, symlink } => {
                assert_eq!(
                    attr.kind,
                    if *symlink { FileKind::Symlink } else { FileKind::Regular },
                    "{path}"
                );
                assert_eq!(attr.size, model.sizes[id], "{path}");
                let links = model
                    .nodes
                    .values()
                    .filter(|n| matches!(n, Node::File { id: other, .. } if other == id))
                    .count() as u32;
                assert_eq!(attr.nlink, links, "{path}");
                assert_eq!(
                    *identity.entry(*id).or_insert(attr.ino),
                    attr.ino,
                    "{path}: hard links share one inode"
                );
            }
        }
    }
    let root_subdirs =
        model.children(&[]).iter().filter(|c| model.nodes[*c] == Node::Dir).count() as u32;
    assert_eq!(ns.getattr(ROOT_INO).unwrap().nlink, 2 + root_subdirs);
}

fn seeds() -> Vec<u64> {
    match std::env::var("SPILLWAY_MODEL_SEED") {
        Ok(seed) => vec![seed.parse().expect("SPILLWAY_MODEL_SEED is a number")],
        Err(_) => {
            let base: u64 = rand::random::<u32>() as u64;
            (0..6).map(|i| base * 16 + i).collect()
        }
    }
}

fn run(ns: &dyn Namespace, seed: u64, steps: usize) -> Model {
    eprintln!("model test seed {seed} (replay: SPILLWAY_MODEL_SEED={seed})");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut model = Model::default();
    let mut last = Vec::new();
    for i in 0..steps {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            step(ns, &mut model, &mut rng)
        }));
        match outcome {
            Ok(description) => {
                last.push(description);
                if last.len() > 8 {
                    last.remove(0);
                }
            }
            Err(panic) => {
                eprintln!("seed {seed}, step {i}; the steps before: {last:#?}");
                std::panic::resume_unwind(panic);
            }
        }
        if i % 25 == 24 {
            compare(ns, &model);
        }
    }
    compare(ns, &model);
    model
}

#[test]
fn local_namespace_matches_the_reference_model() {
    for seed in seeds() {
        let ns = crate::namespace();
        run(&ns, seed, 1500);
        ns.check_invariants().unwrap();
    }
}

#[test]
fn a_journaled_namespace_recovers_the_model_state() {
    let seed = seeds()[0];
    let dir = tempfile::tempdir().unwrap();
    let (ns, _, _) =
        LocalNamespace::open(dir.path(), &config(3), true, clock(), capacity(), options()).unwrap();
    let model = run(&ns, seed, 800);
    let before = crate::recovery::tree(&ns);
    drop(ns);
    let (again, _, recovery) =
        LocalNamespace::open(dir.path(), &config(3), false, clock(), capacity(), options())
            .unwrap();
    assert_eq!(recovery.torn_bytes_cut, 0);
    assert_eq!(crate::recovery::tree(&again), before);
    compare(&again, &model);
    again.compact().unwrap();
    drop(again);
    let (third, _, _) =
        LocalNamespace::open(dir.path(), &config(3), false, clock(), capacity(), options())
            .unwrap();
    assert_eq!(crate::recovery::tree(&third), before);
}
