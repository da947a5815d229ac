"""Value mutators shared by the format fuzzers: what an attacker puts in a field.

Integers go to the edges (0, +-1, 2**31, 2**32, 2**63, 2**64 - 1 and their neighbours),
floats to NaN, infinities, zero and denormals, strings to the empty string, huge strings,
invalid UTF-8 and file names that climb out of the model directory or name files an
attacker would like read; JSON values are retyped (a number becomes a string, a list, an
object, null). Everything is drawn from a seeded ``random.Random``, so a campaign is
reproducible from its seed.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any

EDGE_INTS = (
    0, 1, -1, 2, 3, 7, 8, 31, 32, 33, 63, 64, 255, 256, 4095, 4096, 65535, 65536,
    2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1, 2**32, 2**32 + 1, 2**28, 2**53, 2**62,
    2**63 - 1, 2**63, 2**64 - 1, -(2**31), -(2**63),
)  # fmt: skip
EDGE_FLOATS = (0.0, -0.0, -1.0, 1.0, math.nan, math.inf, -math.inf, 5e-324, 1e-45, 1e-300,
               3.4e38, 1e308, 0.5, 1.0000001)  # fmt: skip

# Names that leave the model directory. OUTSIDE is replaced by the campaign's decoy
# directory (absolute), so an escape shows up as an open of a file there.
ESCAPES = (
    "../outside/secret.safetensors", "../outside/secret.gguf", "../../outside/secret.json",
    "OUTSIDE/secret.safetensors", "OUTSIDE/secret.json", "/etc/passwd",
    "/proc/self/environ", "/dev/zero", "sub/../../outside/secret.safetensors",
    "./../outside/secret.safetensors", "~/secret.safetensors",
)  # fmt: skip


def edge_int(rng: random.Random, current: int | None = None) -> int:
    if current is not None and rng.random() < 0.3:
        return rng.choice((current + 1, current - 1, current * 2, current // 2, -current,
                           current + 2**32, current * 1000))  # fmt: skip
    return rng.choice(EDGE_INTS)


def edge_float(rng: random.Random) -> float:
    return rng.choice(EDGE_FLOATS)


def edge_str(rng: random.Random, outside: str) -> str | bytes:
    pick = rng.randrange(9)
    if pick == 0:
        return ""
    if pick == 1:
        return "x" * rng.choice((300, 5000, 70000))
    if pick == 2:
        return b"\xff\xfe\xc3" + bytes(rng.randrange(256) for _ in range(5))  # not UTF-8
    if pick == 3:
        return "\x00abc"
    if pick == 4:
        return rng.choice(("llama", "qwen3moe", "abc", "gpt2", "none", "F64", "yarn", "llama3"))
    if pick == 5:
        return "\u2581\u00e9\U0001f600"
    return escape(rng, outside)


def escape(rng: random.Random, outside: str) -> str:
    return rng.choice(ESCAPES).replace("OUTSIDE", outside)


def json_value(rng: random.Random, outside: str, current: Any = None) -> Any:
    """A JSON value of a random type, edge-valued."""
    pick = rng.randrange(10)
    if pick <= 2:
        return edge_int(rng, current if type(current) is int else None)
    if pick == 3:
        return edge_float(rng)
    if pick == 4:
        s = edge_str(rng, outside)
        return s.decode("latin-1") if isinstance(s, bytes) else s
    if pick == 5:
        return None
    if pick == 6:
        return rng.choice((True, False))
    if pick == 7:
        return [] if current is None else [current]
    if pick == 8:
        return {} if rng.random() < 0.5 else {"x": current}
    return str(current)  # a number as a string, a list as its repr


def _paths(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:64]):  # long lists: their first elements stand for them
            out += _paths(v, (*path, i))
    return out


def _get(obj: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def mutate_json(
    rng: random.Random, doc: Any, outside: str, prefer: tuple[str, ...] = ()
) -> tuple[Any, str]:
    """A copy of ``doc`` with one node changed, and what was done. ``prefer`` biases the
    choice toward paths starting with those top-level keys (the interesting parts)."""
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return json_value(rng, outside), "replaced the whole document"
    if prefer and rng.random() < 0.7:
        preferred = [p for p in paths if p[0] in prefer]
        paths = preferred or paths
    path = rng.choice(paths)
    parent = _get(doc, path[:-1])
    key = path[-1]
    current = parent[key]
    op = rng.randrange(8)
    if op == 0 and isinstance(parent, dict):
        del parent[key]
        return doc, f"deleted {path}"
    if op == 1 and isinstance(parent, dict):
        parent["unexpected_" + str(rng.randrange(100))] = json_value(rng, outside)
        return doc, f"added a key next to {path}"
    if op == 2 and isinstance(current, list) and current:
        if rng.random() < 0.5:
            current.pop(rng.randrange(len(current)))
        else:
            current.append(copy.deepcopy(current[rng.randrange(len(current))]))
        return doc, f"resized the list at {path}"
    if op == 3 and isinstance(current, str):
        parent[key] = escape(rng, outside)
        return doc, f"set {path} to a path outside the model"
    parent[key] = json_value(rng, outside, current)
    return doc, f"set {path} to {repr(parent[key])[:60]}"
