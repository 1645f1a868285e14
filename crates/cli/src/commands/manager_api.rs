//! What every manager-facing command shares: the `--manager`/`--json` flags, the API client with
//! one-line errors, the table printer and JSON output.

use spillway_manager::ApiClient;

/// Flags shared by every command that talks to the manager.
#[derive(clap::Args, Clone, Debug)]
pub struct ManagerFlags {
    /// The manager's Unix socket (or tcp://ADDRESS:PORT: beyond loopback the manager has
    /// manager.auth = munge and requests carry munge credentials); default $SPILLWAY_MANAGER,
    /// else /run/spillway/manager.sock.
    #[arg(long, value_name = "PATH")]
    pub manager: Option<String>,
    /// Print one JSON object or array on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl ManagerFlags {
    pub fn client(&self) -> anyhow::Result<Api> {
        Ok(Api(ApiClient::from_flag(self.manager.as_deref()).map_err(flat)?))
    }
}

/// An error as one line: its own message, which already names the cause (anyhow's `{:#}`
/// would repeat the source of errors that print it).
pub fn flat(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{error}")
}

/// The manager's API with one-line errors for the CLI.
pub struct Api(pub ApiClient);

impl Api {
    pub fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.0.get(path).map_err(flat)
    }
    pub fn delete<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.0.delete(path).map_err(flat)
    }
    pub fn post<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.0.post(path, body).map_err(flat)
    }
    pub fn put<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.0.put(path, body).map_err(flat)
    }
    pub fn patch<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.0.patch(path, body).map_err(flat)
    }
}

/// Prints `value` as one line of JSON.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

/// Prints an aligned table with a header row.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let text: Vec<String> =
            cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        println!("{}", text.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
