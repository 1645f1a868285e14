//! Pure placement and scheduling decisions shared by the daemons and the simulators.
