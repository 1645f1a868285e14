"""Spillway planning tools in Python: the trace format and Darshan conversion.

The Rust side (crates/sim, `spillway sim` and `spillway characterize`) consumes what these
produce; both implement docs/design/trace.md byte for byte.
"""

from .trace import JobMeta, Op, Trace, TraceError, TraceOp, TraceReader, TraceWriter, load, loads, dumps, save

__all__ = ["JobMeta", "Op", "Trace", "TraceError", "TraceOp", "TraceReader", "TraceWriter", "load", "loads", "dumps", "save"]
__version__ = "0.1.0"
