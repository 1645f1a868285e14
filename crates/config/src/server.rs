//! Knobs of the burst buffer server (network side). Owned by the server.

use crate::{knobs, ConfigError};

knobs! {
    /// The burst buffer server process.
    section "server";
    pub struct ServerKnobs {
        /// TCP address to listen on. Non-loopback addresses need `--insecure-tcp`.
        listen_address: String = "127.0.0.1:7070".to_string(), unit = "host:port";
    }
}

impl ServerKnobs {
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}
