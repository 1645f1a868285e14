//! Client library: server lists, striped and local placement, checkpoint API.
