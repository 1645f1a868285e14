//! The burst buffer server: protocol handlers over one store.
