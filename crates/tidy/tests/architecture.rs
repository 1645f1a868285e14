//! ARCHITECTURE.md's crate graph is Cargo's: the fenced block after the heading "Crate graph"
//! lists every workspace crate as `name: dependency, dependency` (its normal and build
//! dependencies inside the workspace; dev-dependencies are left out), and this test compares it
//! with `cargo metadata`. A crate added, removed or rewired without updating the map fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use spillway_tidy::{read_repository_file, repository_root};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The graph as ARCHITECTURE.md states it.
fn documented_graph() -> Graph {
    let text = read_repository_file("ARCHITECTURE.md");
    let after_heading = text
        .split_once("## Crate graph")
        .expect("ARCHITECTURE.md has a `## Crate graph` section")
        .1;
    let block = after_heading
        .split_once("```text\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the Crate graph section has a ```text block")
        .0;
    let mut graph = Graph::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let (name, dependencies) =
            line.split_once(':').unwrap_or_else(|| panic!("not `crate: deps`: {line:?}"));
        let dependencies: BTreeSet<String> = dependencies
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty() && *d != "-")
            .map(str::to_string)
            .collect();
        let previous = graph.insert(name.trim().to_string(), dependencies);
        assert!(previous.is_none(), "{name} is listed twice in ARCHITECTURE.md");
    }
    graph
}

/// The graph Cargo resolves: workspace members and their non-dev workspace dependencies.
fn cargo_graph() -> Graph {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(repository_root())
        .output()
        .expect("running cargo metadata");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let members: BTreeSet<String> =
        packages.iter().map(|p| p["name"].as_str().unwrap().to_string()).collect();
    packages
        .iter()
        .map(|package| {
            let dependencies = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .map(|d| d["name"].as_str().unwrap().to_string())
                .filter(|name| members.contains(name))
                .collect();
            (package["name"].as_str().unwrap().to_string(), dependencies)
        })
        .collect()
}

#[test]
fn architecture_md_states_the_crate_graph_cargo_builds() {
    let documented = documented_graph();
    let built = cargo_graph();
    let mut problems = Vec::new();
    for (name, dependencies) in &built {
        match documented.get(name) {
            None => problems.push(format!("{name} is missing from ARCHITECTURE.md")),
            Some(stated) if stated != dependencies => problems.push(format!(
                "{name}: ARCHITECTURE.md says {stated:?}, Cargo.toml says {dependencies:?}"
            )),
            Some(_) => {}
        }
    }
    for name in documented.keys().filter(|name| !built.contains_key(*name)) {
        problems.push(format!("{name} is in ARCHITECTURE.md but not in the workspace"));
    }
    assert!(problems.is_empty(), "crate graph drift:\n  {}", problems.join("\n  "));
}

#[test]
fn the_crate_graph_has_no_cycle_and_no_crate_is_left_unused() {
    let graph = cargo_graph();
    // Kahn's algorithm: a graph without cycles empties completely.
    let mut remaining = graph.clone();
    while !remaining.is_empty() {
        let leaves: Vec<String> = remaining
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !remaining.contains_key(d)))
            .map(|(name, _)| name.clone())
            .collect();
        assert!(!leaves.is_empty(), "dependency cycle among {:?}", remaining.keys());
        for leaf in leaves {
            remaining.remove(&leaf);
        }
    }
    let depended_on: BTreeSet<&String> = graph.values().flatten().collect();
    let roots: BTreeSet<&String> = graph.keys().filter(|n| !depended_on.contains(n)).collect();
    // The binary, the C library, the LD_PRELOAD library (which nothing may link: its libc
    // wrappers would take over the linking program) and this checker stand on top; nothing else
    // is left unused.
    let expected: BTreeSet<String> =
        ["spillway", "spillway-capi", "spillway-preload", "spillway-tidy"]
            .into_iter()
            .map(String::from)
            .collect();
    let roots: BTreeSet<String> = roots.into_iter().cloned().collect();
    assert_eq!(roots, expected, "crates nothing depends on");
}
