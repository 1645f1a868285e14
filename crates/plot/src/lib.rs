//! Dependency-free SVG line charts and HTML tables for reports.
