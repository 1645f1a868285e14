//! Short-lived commands of users and operators: they talk to the manager (`pool`, `server`,
//! `quota`, `reservation`, `status`, `tiers`), copy data (`stage-in`, `stage-out`), drive the servers'
//! drains (`drain`), serve a reservation as a POSIX file system (`mount`, `umount`) or
//! describe the binary itself (`completions`, `man`).

pub mod drain;
pub mod generate;
pub mod manager_api;
pub mod mount;
pub mod pool;
pub mod reservation;
pub mod stage;
pub mod status;
pub mod tiers;
