"""Sizes in the words logs and plans use: one spelling for the plan's KV decision and the
engine's start-up KV line, which live in wings that may not import each other."""

from __future__ import annotations


def byte_size(size: int) -> str:
    """`394 KiB`, `16.0 MiB`, `1.50 GiB`: bytes in the largest binary unit under which
    they stay a readable number."""
    if size < 1 << 20:
        return f"{size / 1024:,.0f} KiB"
    if size < 1 << 30:
        return f"{size / (1 << 20):,.1f} MiB"
    return f"{size / (1 << 30):,.2f} GiB"
