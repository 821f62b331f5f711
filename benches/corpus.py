"""Distinct real English messages for the benchmarks, built from text every Debian
machine has (the licence texts and the packages' changelogs), so that no piece
cache or repeated string hides the cost of counting.

Deterministic for a given machine: files in sorted order, consecutive slices of
exactly `size` bytes that decode as UTF-8, duplicates dropped. The sha256 of the
corpus is reported next to every figure measured on it.
"""

import glob
import gzip
import hashlib
import os

SOURCES = ["/usr/share/common-licenses/*", "/usr/share/doc/*/changelog*"]


def _texts():
    for pattern in SOURCES:
        for path in sorted(glob.glob(pattern)):
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            try:
                opener = gzip.open if path.endswith(".gz") else open
                with opener(path, "rb") as f:
                    raw = f.read()
            except (OSError, EOFError):
                continue
            yield raw


def messages(count, size):
    """`count` distinct messages of exactly `size` bytes (fewer if the machine has
    less text: the caller reports how many it got)."""
    out, seen = [], set()
    for raw in _texts():
        for i in range(0, len(raw) - size + 1, size):
            chunk = raw[i:i + size]
            if chunk in seen:
                continue
            try:
                text = chunk.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if not text.strip():
                continue
            seen.add(chunk)
            out.append(text)
            if len(out) == count:
                return out
    return out


def digest(msgs):
    h = hashlib.sha256()
    for m in msgs:
        h.update(m.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
