//! Versioned wire protocol between clients and burst buffer servers; errno table.
