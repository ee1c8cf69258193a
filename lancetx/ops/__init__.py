"""Operator tools as plain functions: each takes an opened table (:mod:`lancetx.ops.table`)
and returns a dataclass report. ``lancetx-sync`` (:mod:`lancetx.cli`) is a thin layer over them."""
