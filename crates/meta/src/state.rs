//! The namespace's in-memory state and the only way it changes: [`Mutation`]s.
//!
//! Every operation of `LocalNamespace` first *plans* (reads the state, checks permissions,
//! computes a list of mutations), then the mutations go to the journal, then they are applied
//! here. Recovery replays the journal through the same [`State::apply`], so the live state and
//! the recovered one cannot diverge. Mutations are effects (an inode's full new record, an entry
//! added or removed), not requests: replay needs no permission logic and no clock.
//!
//! Invariants ([`State::check`]): every entry names an existing inode; a non-directory's nlink
//! is the number of entries naming it; a directory is named by exactly one entry (the root by
//! none), its `parent` is the directory holding that entry, and its nlink is 2 + its
//! subdirectories; following parents from any directory reaches the root (no cycles); inode
//! numbers stay below `next_ino`.

use std::collections::{BTreeMap, HashMap};

use spillway_namespace::{Attr, FileKind, Ino, ROOT_INO};

/// One inode: its attributes, a symlink's target, a directory's parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub attr: Attr,
    /// Symlink target; empty for other kinds.
    pub target: Vec<u8>,
    /// The directory holding this directory's entry (the root's parent is the root); 0 for
    /// non-directories (which may have several parents).
    pub parent: Ino,
}

/// One directory's entries: by name, and by cookie for readdir order.
#[derive(Clone, Debug, Default)]
pub struct Directory {
    pub by_name: HashMap<Vec<u8>, (Ino, u64)>,
    pub by_cookie: BTreeMap<u64, Vec<u8>>,
    /// The next cookie to hand out; cookies of entries only grow. 1 and 2 are `.` and `..`.
    pub next_cookie: u64,
}

/// The first cookie of a real entry (1 is `.`, 2 is `..`).
pub const FIRST_ENTRY_COOKIE: u64 = 3;

/// A change of the state. Applying a list of them is one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// Inserts or replaces an inode (a new directory starts with no entries).
    PutInode(Inode),
    /// Removes an inode (a directory must be empty).
    DropInode(Ino),
    /// Adds (or repoints) the entry `name` in directory `dir`.
    PutEntry { dir: Ino, name: Vec<u8>, ino: Ino, cookie: u64 },
    /// Removes the entry `name` from directory `dir`.
    DropEntry { dir: Ino, name: Vec<u8> },
    /// Inode numbers below this are used (never reused, even after their inode is gone).
    NextIno(Ino),
}

/// Why a mutation could not be applied (a corrupt journal, or a bug in a plan).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ApplyError(pub String);

/// All inodes and directories of one namespace.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub inodes: HashMap<Ino, Inode>,
    pub directories: HashMap<Ino, Directory>,
    pub next_ino: Ino,
}

impl State {
    /// A state with no inodes at all (before the root is put).
    pub fn empty() -> State {
        State { inodes: HashMap::new(), directories: HashMap::new(), next_ino: ROOT_INO + 1 }
    }

    pub fn inode(&self, ino: Ino) -> Option<&Inode> {
        self.inodes.get(&ino)
    }

    pub fn directory(&self, ino: Ino) -> Option<&Directory> {
        self.directories.get(&ino)
    }

    /// The entry `name` of directory `dir`: (inode, cookie).
    pub fn entry(&self, dir: Ino, name: &[u8]) -> Option<(Ino, u64)> {
        self.directories.get(&dir)?.by_name.get(name).copied()
    }

    /// Applies one mutation. Errors only on inconsistent input (a corrupt journal); live
    /// operations assert success.
    pub fn apply(&mut self, mutation: Mutation) -> Result<(), ApplyError> {
        match mutation {
            Mutation::PutInode(inode) => self.apply_put_inode(inode)?,
            Mutation::DropInode(ino) => self.apply_drop_inode(ino)?,
            Mutation::PutEntry { dir, name, ino, cookie } => {
                self.apply_put_entry(dir, name, ino, cookie)?
            }
            Mutation::DropEntry { dir, name } => self.apply_drop_entry(dir, name)?,
            Mutation::NextIno(next) => {
                self.next_ino = self.next_ino.max(next);
            }
        }
        Ok(())
    }

    /// Applies `Mutation::PutInode`: inserts or replaces the inode (a new directory is empty).
    fn apply_put_inode(&mut self, inode: Inode) -> Result<(), ApplyError> {
        let ino = inode.attr.ino;
        if ino == 0 || ino >= self.next_ino && ino != ROOT_INO {
            return Err(ApplyError(format!(
                "inode {ino} put before its number was allocated (next {})",
                self.next_ino
            )));
        }
        if let Some(old) = self.inodes.get(&ino) {
            if old.attr.kind != inode.attr.kind {
                return Err(ApplyError(format!(
                    "inode {ino} changes kind {:?} -> {:?}",
                    old.attr.kind, inode.attr.kind
                )));
            }
        }
        if inode.attr.kind == FileKind::Directory {
            self.directories.entry(ino).or_insert_with(|| Directory {
                next_cookie: FIRST_ENTRY_COOKIE,
                ..Directory::default()
            });
        }
        self.inodes.insert(ino, inode);
        Ok(())
    }

    /// Applies `Mutation::DropInode`: removes the inode (a directory must be empty).
    fn apply_drop_inode(&mut self, ino: Ino) -> Result<(), ApplyError> {
        if ino == ROOT_INO {
            return Err(ApplyError("the root inode cannot be dropped".into()));
        }
        if self.inodes.remove(&ino).is_none() {
            return Err(ApplyError(format!("dropping inode {ino}, which does not exist")));
        }
        if let Some(dir) = self.directories.remove(&ino) {
            if !dir.by_name.is_empty() {
                return Err(ApplyError(format!(
                    "dropping directory {ino} with {} entries",
                    dir.by_name.len()
                )));
            }
        }
        Ok(())
    }

    /// Applies `Mutation::PutEntry`: adds (or repoints) the entry `name` in directory `dir`.
    fn apply_put_entry(
        &mut self,
        dir: Ino,
        name: Vec<u8>,
        ino: Ino,
        cookie: u64,
    ) -> Result<(), ApplyError> {
        if !self.inodes.contains_key(&ino) {
            return Err(ApplyError(format!(
                "entry {:?} in {dir} names missing inode {ino}",
                String::from_utf8_lossy(&name)
            )));
        }
        let directory = self.directories.get_mut(&dir).ok_or_else(|| {
            ApplyError(format!(
                "entry {:?} put in {dir}, which is not a directory",
                String::from_utf8_lossy(&name)
            ))
        })?;
        if cookie < FIRST_ENTRY_COOKIE {
            return Err(ApplyError(format!("entry cookie {cookie} is reserved")));
        }
        if let Some((_, old_cookie)) = directory.by_name.insert(name.clone(), (ino, cookie)) {
            directory.by_cookie.remove(&old_cookie);
        }
        if directory.by_cookie.insert(cookie, name).is_some() {
            return Err(ApplyError(format!("cookie {cookie} used twice in directory {dir}")));
        }
        directory.next_cookie = directory.next_cookie.max(cookie + 1);
        Ok(())
    }

    /// Applies `Mutation::DropEntry`: removes the entry `name` from directory `dir`.
    fn apply_drop_entry(&mut self, dir: Ino, name: Vec<u8>) -> Result<(), ApplyError> {
        let directory = self.directories.get_mut(&dir).ok_or_else(|| {
            ApplyError(format!("entry removed from {dir}, which is not a directory"))
        })?;
        let (_, cookie) = directory.by_name.remove(&name).ok_or_else(|| {
            ApplyError(format!(
                "removing {:?} from {dir}: no such entry",
                String::from_utf8_lossy(&name)
            ))
        })?;
        directory.by_cookie.remove(&cookie);
        Ok(())
    }

    /// Checks every invariant listed in the module doc; returns the first violation.
    pub fn check(&self) -> Result<(), String> {
        let root = self.inodes.get(&ROOT_INO).ok_or("no root inode")?;
        if root.attr.kind != FileKind::Directory || root.parent != ROOT_INO {
            return Err(format!("root is {:?} with parent {}", root.attr.kind, root.parent));
        }
        let counts = self.check_entries()?;
        for (&ino, inode) in &self.inodes {
            self.check_inode(ino, inode, &counts)?;
        }
        Ok(())
    }

    /// Checks every directory's entries; counts names per inode and subdirectories per directory.
    fn check_entries(&self) -> Result<EntryCounts, String> {
        let mut names: HashMap<Ino, u32> = HashMap::new();
        let mut subdirectories: HashMap<Ino, u32> = HashMap::new();
        for (&dir, directory) in &self.directories {
            if self.inodes.get(&dir).map(|i| i.attr.kind) != Some(FileKind::Directory) {
                return Err(format!("directory table holds {dir}, which is not a directory inode"));
            }
            if directory.by_name.len() != directory.by_cookie.len() {
                return Err(format!(
                    "directory {dir}: {} names but {} cookies",
                    directory.by_name.len(),
                    directory.by_cookie.len()
                ));
            }
            for (name, &(ino, cookie)) in &directory.by_name {
                let child = self.inodes.get(&ino).ok_or_else(|| {
                    format!(
                        "entry {:?} in {dir} names missing inode {ino}",
                        String::from_utf8_lossy(name)
                    )
                })?;
                if directory.by_cookie.get(&cookie) != Some(name) || cookie >= directory.next_cookie
                {
                    return Err(format!(
                        "entry {:?} in {dir}: cookie {cookie} inconsistent",
                        String::from_utf8_lossy(name)
                    ));
                }
                if name.is_empty()
                    || name == b"."
                    || name == b".."
                    || name.contains(&b'/')
                    || name.contains(&0)
                {
                    return Err(format!("directory {dir} holds an invalid name {name:?}"));
                }
                *names.entry(ino).or_default() += 1;
                if child.attr.kind == FileKind::Directory {
                    *subdirectories.entry(dir).or_default() += 1;
                    if child.parent != dir {
                        return Err(format!(
                            "directory {ino} is in {dir} but records parent {}",
                            child.parent
                        ));
                    }
                }
            }
        }
        Ok(EntryCounts { names, subdirectories })
    }

    /// Checks one inode's number, links, place in the tree and symlink target.
    fn check_inode(&self, ino: Ino, inode: &Inode, counts: &EntryCounts) -> Result<(), String> {
        if inode.attr.ino != ino || ino >= self.next_ino {
            return Err(format!(
                "inode {ino} records number {} (next {})",
                inode.attr.ino, self.next_ino
            ));
        }
        let named = counts.names.get(&ino).copied().unwrap_or(0);
        if inode.attr.kind == FileKind::Directory {
            self.check_directory_inode(ino, inode, named, &counts.subdirectories)?;
        } else {
            if inode.attr.nlink != named || named == 0 {
                return Err(format!(
                    "inode {ino} has nlink {} but is named by {named} entries",
                    inode.attr.nlink
                ));
            }
            if inode.parent != 0 {
                return Err(format!("non-directory {ino} records parent {}", inode.parent));
            }
        }
        if (inode.attr.kind == FileKind::Symlink) == inode.target.is_empty() {
            return Err(format!(
                "inode {ino} ({:?}) has a target of {} bytes",
                inode.attr.kind,
                inode.target.len()
            ));
        }
        Ok(())
    }

    /// Checks a directory inode: named by one entry (the root by none), nlink, reaches the root.
    fn check_directory_inode(
        &self,
        ino: Ino,
        inode: &Inode,
        named: u32,
        subdirectories: &HashMap<Ino, u32>,
    ) -> Result<(), String> {
        let expected_names = if ino == ROOT_INO { 0 } else { 1 };
        if named != expected_names {
            return Err(format!("directory {ino} is named by {named} entries"));
        }
        let nlink = 2 + subdirectories.get(&ino).copied().unwrap_or(0);
        if inode.attr.nlink != nlink {
            return Err(format!(
                "directory {ino} has nlink {} but {} links",
                inode.attr.nlink, nlink
            ));
        }
        let mut at = ino;
        for _ in 0..=self.directories.len() {
            if at == ROOT_INO {
                break;
            }
            at = self
                .inodes
                .get(&at)
                .map(|i| i.parent)
                .ok_or_else(|| format!("directory {ino}: ancestor {at} missing"))?;
        }
        if at != ROOT_INO {
            return Err(format!("directory {ino} does not reach the root (cycle)"));
        }
        Ok(())
    }
}

/// What [`State::check`] counts in the directories: the entries naming each inode and the
/// subdirectories of each directory.
struct EntryCounts {
    names: HashMap<Ino, u32>,
    subdirectories: HashMap<Ino, u32>,
}
