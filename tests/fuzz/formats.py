"""The fuzzed formats: how each one's mutants are made and what a child does with one.

Each :class:`Format` has ``mutate(rng, seeds, model_dir) -> (entry, description)``, which
writes one mutant into the empty ``model_dir`` and returns the path to load, and
``action(entry)``, run in the child: load the model as a user would and generate two
tokens (plus conversion and verification where the format has them).

:data:`FORMATS` is the registry the campaign runs. Another fuzzer plugs in as a module
that calls :func:`register` when imported, listed in :data:`PLUGINS` (or passed to the
campaign's ``plugins=``): the worker imports it before running. A chat-template fuzzer,
for instance, is a Format whose mutate writes a template (e.g. a tokenizer_config.json
into the model directory) and whose action renders it; the runner, the child isolation,
the classification and the audit are shared.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import gguf_codec as G
from . import harness
from . import safetensors_codec as S
from .mutators import edge_float, edge_int, edge_str, escape, json_value, mutate_json

Mutate = Callable[[random.Random, Path, Path], tuple[Path, str]]


@dataclass(frozen=True)
class Format:
    name: str
    mutate: Mutate  # (rng, seeds dir, empty model dir) -> (entry to load, description)
    action: Callable[[Path, int], None]  # (entry, mutant index), runs in the child


FORMATS: dict[str, Format] = {}
# Modules that register more formats when imported (e.g. "fuzz.chat_template").
PLUGINS: list[str] = []


def register(fmt: Format) -> Format:
    FORMATS[fmt.name] = fmt
    return fmt


def outside_dir(model_dir: Path) -> str:
    """The decoy directory next to the model directory (absolute)."""
    return str(model_dir.parent / "outside")


# ------------------------------------------------------------------------------ actions


def _engine() -> Any:
    import colibri as co

    return co.EngineConfig(
        threads=co.ThreadConfig(n=1), io=co.IOConfig(workers=1),
        cache=co.CacheConfig(history=False), ram_budget="1GiB", context_length=64,
    )  # fmt: skip


def _record_core_files() -> None:
    """The files the core is asked to open, recorded with the audit (strace sees them
    directly; the audit hook cannot, since the core opens them in C++)."""
    from colibri import model as model_module

    real = model_module._core.Engine

    def engine(spec: Any, tensors: Any, files: list[str], *args: Any) -> Any:
        harness.OPENED.extend(os.path.abspath(f) for f in files)
        return real(spec, tensors, files, *args)

    model_module._core = _CoreProxy(model_module._core, engine)  # type: ignore[assignment]


class _CoreProxy:
    def __init__(self, core: Any, engine: Any) -> None:
        self._c, self.Engine = core, engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


def load_and_generate(entry: Path, index: int = 0) -> None:
    import colibri as co

    _record_core_files()
    with co.Model.load(entry, _engine()) as model:
        model.generate([1, 2, 3], max_tokens=2, sampling={"temperature": 0})


def load_convert_verify(entry: Path, index: int = 0) -> None:
    from colibri.convert import verify_container, write_container

    load_and_generate(entry)
    out = entry / "converted"  # inside the model directory, the one place it may read
    write_container(entry, out, quant="q8_0")
    if verify_container(out):
        raise AssertionError("a fresh conversion does not verify")


def verify_then_load(entry: Path, index: int = 0) -> None:
    from colibri.convert import verify_container

    verify_container(entry)  # a list of problems, or a colibri error for a bad manifest
    load_and_generate(entry)


# ------------------------------------------------------------------------------ GGUF

_GGUF_KEYS = (
    "block_count", "expert_count", "expert_used_count", "attention.head_count",
    "attention.head_count_kv", "embedding_length", "context_length", "feed_forward_length",
    "rope.freq_base", "attention.layer_norm_rms_epsilon", "attention.key_length",
    "attention.value_length", "rope.dimension_count", "expert_feed_forward_length",
    "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
)  # fmt: skip


@lru_cache(maxsize=8)
def _gguf_seed(path: Path) -> tuple[bytes, G.GGUFDoc]:
    buf = path.read_bytes()
    return buf, G.parse(buf)


def _set_value(kv: G.KV, value: Any) -> None:
    """kv's value, widening its declared type when the value does not fit."""
    kv.raw = None
    if kv.vtype == G.ARRAY or G.fits(kv.vtype, value):
        kv.value = value
        return
    if isinstance(value, bool):
        kv.vtype = G.BOOL
    elif isinstance(value, int):
        kv.vtype = G.U64 if value >= 0 else G.I64
        value = max(min(value, 2**64 - 1), -(2**63))
    elif isinstance(value, float):
        kv.vtype = G.F64
    else:
        kv.vtype = G.STRING
    kv.value = value


def _retyped(rng: random.Random, kv: G.KV, outside: str) -> None:
    kind = rng.choice((G.STRING, G.F32, G.BOOL, G.ARRAY, G.U8, G.I32, G.U64, G.F64, 13, 99))
    kv.raw = None
    if kind == G.STRING:
        kv.vtype, kv.value = G.STRING, str(kv.value)[:200]
    elif kind in G.FLOAT_TYPES:
        kv.vtype, kv.value = kind, edge_float(rng)
    elif kind == G.BOOL:
        kv.vtype, kv.value = G.BOOL, rng.random() < 0.5
    elif kind == G.ARRAY:
        kv.vtype, kv.etype = G.ARRAY, rng.choice((G.U32, G.STRING, G.F32))
        kv.value = [{G.U32: 1, G.STRING: "a", G.F32: 1.0}[kv.etype]] * rng.choice((0, 1, 3))
    elif kind in G.INT_TYPES:
        v = edge_int(rng)
        kv.vtype, kv.value = (kind, v) if G.fits(kind, v) else (G.U64, abs(v) % 2**64)
    else:  # an unknown value type: the reader must refuse it
        kv.vtype, kv.raw = kind, bytes(rng.randrange(256) for _ in range(rng.randrange(9)))


def _mutate_kv(rng: random.Random, doc: G.GGUFDoc, outside: str) -> str:
    arch = next((kv.value for kv in doc.kvs if kv.key == "general.architecture"), "llama")
    op = rng.randrange(10)
    if op <= 3:  # a key the loader reads: the defects live here
        key = f"{arch}.{rng.choice(_GGUF_KEYS)}"
        kv = next((k for k in doc.kvs if k.key == key), None)
        if kv is None:
            kv = G.KV(key, G.U32, 1)
            doc.kvs.append(kv)
        if rng.random() < 0.2:
            _retyped(rng, kv, outside)
            return f"retyped {key}"
        if key.endswith("scaling.type"):
            _set_value(kv, rng.choice(("linear", "yarn", "llama3", "dynamic", "none", "x")))
        elif kv.vtype in G.FLOAT_TYPES or rng.random() < 0.3:
            _set_value(kv, edge_float(rng))
        else:
            _set_value(kv, edge_int(rng, kv.value if type(kv.value) is int else None))
        return f"set {key} to {kv.value!r:.40}"
    kv = rng.choice(doc.kvs)
    if op == 4:
        _retyped(rng, kv, outside)
        return f"retyped {kv.key!r:.60}"
    if op == 5 and kv.vtype == G.ARRAY and kv.value:
        items = list(kv.value)
        i = rng.randrange(len(items))
        if kv.etype == G.STRING:
            items[i] = edge_str(rng, outside)
        elif kv.etype in G.INT_TYPES:
            v = edge_int(rng)
            items[i] = v if G.fits(kv.etype, v) else 0
        elif kv.etype in G.FLOAT_TYPES:
            items[i] = edge_float(rng)
        if rng.random() < 0.3:
            items = items[: rng.randrange(len(items) + 1)]
        kv.value = items
        return f"edited array {kv.key!r:.60} at {i}"
    if op == 6:
        doc.kvs.remove(kv)
        return f"deleted {kv.key!r:.60}"
    if op == 7:
        other = rng.choice(doc.kvs)
        doc.kvs.append(G.KV(other.key, kv.vtype, kv.value, kv.etype))
        return f"added a second {other.key!r:.60}"
    if op == 8 and kv.vtype == G.STRING:
        kv.value = edge_str(rng, outside)
        return f"set string {kv.key!r:.60}"
    kv.raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 17)))
    return f"raw bytes for {kv.key!r:.60}"


def _mutate_tensor(rng: random.Random, doc: G.GGUFDoc, outside: str) -> str:
    if not doc.tensors:
        return "no tensors"
    t = rng.choice(doc.tensors)
    op = rng.randrange(8)
    if op <= 1 and t.dims:
        i = rng.randrange(len(t.dims))
        t.dims[i] = edge_int(rng, t.dims[i]) % 2**64
        return f"tensor {t.name!r:.40} dim {i} = {t.dims[i]}"
    if op == 2:
        t.ggml_type = rng.choice((*range(0, 42), 99, 2**32 - 1))
        return f"tensor {t.name!r:.40} type {t.ggml_type}"
    if op == 3:
        t.offset = rng.choice((edge_int(rng, t.offset) % 2**64, t.offset + doc.alignment,
                               max(t.offset - doc.alignment, 0)))  # fmt: skip
        return f"tensor {t.name!r:.40} offset {t.offset}"
    if op == 4:
        t.name = rng.choice((
            rng.choice(doc.tensors).name, "blk.2147483647.attn_norm.weight",
            "blk.99999999999999999999.attn_norm.weight", edge_str(rng, outside),
            "rope_freqs.weight", "blk.0.ffn_gate_exps.weight",
        ))  # fmt: skip
        return f"renamed a tensor to {t.name!r:.40}"
    if op == 5:
        doc.tensors.remove(t)
        return f"deleted tensor {t.name!r:.40}"
    if op == 6:
        t.dims = [*t.dims, edge_int(rng) % 2**64] if rng.random() < 0.5 else t.dims[:-1]
        return f"tensor {t.name!r:.40} dims {t.dims}"
    doc.tensors.append(copy.deepcopy(t))
    return f"duplicated tensor {t.name!r:.40}"


def _mutate_vocab(rng: random.Random, doc: G.GGUFDoc, outside: str) -> str:
    kvs = {kv.key: kv for kv in doc.kvs}
    tokens = kvs.get("tokenizer.ggml.tokens")
    op = rng.randrange(5)
    if op == 0 and tokens is not None and tokens.value:
        i = rng.randrange(len(tokens.value))
        v = list(tokens.value)
        raw = v[i].encode("utf-8", "surrogateescape") if isinstance(v[i], str) else v[i]
        flipped = bytearray(raw or b"a")
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        v[i] = bytes(flipped)
        tokens.value = v
        return f"flipped a bit in token {i}"
    key = rng.choice(("tokenizer.ggml.model", "tokenizer.ggml.token_type", "tokenizer.ggml.scores",
                      "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                      "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.chat_template",
                      "tokenizer.ggml.add_bos_token"))  # fmt: skip
    kv = kvs.get(key)
    if kv is None:
        kv = G.KV(key, G.STRING, "gpt2")
        doc.kvs.append(kv)
    if kv.vtype == G.ARRAY and kv.value and op <= 2:
        v = list(kv.value)
        i = rng.randrange(len(v))
        v[i] = {G.STRING: "x y z", G.F32: edge_float(rng)}.get(kv.etype, edge_int(rng) % 2**31)
        kv.value = v
        return f"edited {key} at {i}"
    _retyped(rng, kv, outside) if op == 3 else _set_value(kv, json_value(rng, outside))
    return f"changed {key}"


def _split_mutation(rng: random.Random, doc: G.GGUFDoc, outside: str) -> str:
    doc.kvs.append(G.KV("split.count", G.U16, rng.choice((0, 1, 2, 65535))))
    doc.kvs.append(G.KV("split.no", G.U16, 0))
    return "split GGUF keys"


def _one_gguf_mutation(rng: random.Random, doc: G.GGUFDoc, outside: str) -> str:
    op = rng.randrange(20)
    if op < 9:
        return _mutate_kv(rng, doc, outside)
    if op < 14:
        return _mutate_tensor(rng, doc, outside)
    if op < 17:
        return _mutate_vocab(rng, doc, outside)
    if op == 17:
        setattr(doc, rng.choice(("n_kv", "n_tensors")), edge_int(rng) % 2**64)
        return "lying count"
    if op == 18:
        return _split_mutation(rng, doc, outside)
    kv = next((k for k in doc.kvs if k.key == "general.alignment"), None)
    if kv is None:
        kv = G.KV("general.alignment", G.U32, 32)
        doc.kvs.append(kv)
    _set_value(kv, rng.choice((0, 1, 3, 16, 64, 4096, 2**31, 2**32 - 1)))
    doc.alignment = kv.value if isinstance(kv.value, int) and 0 < kv.value < 2**20 else 32
    return f"alignment {kv.value}"


def mutate_gguf(rng: random.Random, seeds: Path, model_dir: Path) -> tuple[Path, str]:
    seed = rng.choice(sorted((seeds / "gguf").glob("*.gguf")))
    _buf, parsed = _gguf_seed(seed)
    doc = copy.deepcopy(parsed)
    outside = outside_dir(model_dir)
    done = [seed.stem]
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        try:
            done.append(_one_gguf_mutation(rng, doc, outside))
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            done.append("skipped (its field was already mutated)")
    data, marks = G.serialize(doc)
    r = rng.random()
    if r < 0.08:
        cut = rng.choice(marks) + rng.choice((0, 0, -1, 1, 3))
        data = data[: max(cut, 0)]
        done.append(f"truncated at {cut}")
    elif r < 0.12 and len(data) > marks[-1]:
        b = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            b[rng.randrange(marks[-1], len(b))] = rng.randrange(256)
        data = bytes(b)
        done.append("changed tensor bytes")
    entry = model_dir / "model.gguf"
    entry.write_bytes(data)
    return entry, "; ".join(done)


register(Format("gguf", mutate_gguf, load_and_generate))


# ------------------------------------------------------------------------------ safetensors

_HF_KEYS = (
    "num_hidden_layers", "num_experts", "num_local_experts", "num_experts_per_tok",
    "num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size",
    "moe_intermediate_size", "vocab_size", "head_dim", "rope_theta", "rms_norm_eps",
    "max_position_embeddings", "decoder_sparse_step", "mlp_only_layers",
    "tie_word_embeddings", "model_type", "architectures", "norm_topk_prob",
)  # fmt: skip
_ROPE_SCALINGS = (
    {"rope_type": "linear", "factor": 0.0}, {"rope_type": "linear"},
    {"rope_type": "llama3", "factor": 8.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "beta_fast": 0, "original_max_position_embeddings": 0},
    {"rope_type": "yarn", "factor": -1.0}, {"rope_type": "dynamic", "factor": "x"},
    {"rope_type": "longrope", "factor": 2.0}, {"type": "linear", "factor": 1e-320},
)  # fmt: skip


def _write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, allow_nan=True, ensure_ascii=False), errors="surrogatepass")


def _mutate_config(rng: random.Random, d: Path, outside: str) -> str:
    cfg = json.loads((d / "config.json").read_text())
    if rng.random() < 0.6:
        key = rng.choice(_HF_KEYS)
        if key == "rope_theta" and rng.random() < 0.5:
            cfg["rope_scaling"] = copy.deepcopy(rng.choice(_ROPE_SCALINGS))
            cfg["rope_scaling"].setdefault("rope_theta", 10000.0)
            cfg["rope_parameters"] = cfg["rope_scaling"]
            what = f"rope scaling {cfg['rope_scaling']}"
        else:
            v = cfg.get(key)
            new = edge_int(rng, v if type(v) is int else None) if rng.random() < 0.6 else \
                json_value(rng, outside, v)  # fmt: skip
            cfg[key] = new
            if key == "rope_theta" and isinstance(cfg.get("rope_parameters"), dict):
                cfg["rope_parameters"]["rope_theta"] = new
            what = f"config {key} = {new!r:.40}"
    else:
        cfg, what = mutate_json(rng, cfg, outside)
    _write_json(d / "config.json", cfg)
    return what


def _shards(d: Path) -> list[Path]:
    return sorted(d.glob("*.safetensors"))


def _mutate_shard(rng: random.Random, d: Path, outside: str) -> str:
    shard = rng.choice(_shards(d))
    header, data = S.parse(shard.read_bytes())
    op = rng.randrange(10)
    length = None
    if op <= 5:
        names = [k for k in header if k != "__metadata__"]
        name = rng.choice(names)
        info = header[name]
        field = rng.choice(("dtype", "shape", "data_offsets", "name"))
        if field == "name":
            new_name = rng.choice((
                rng.choice(names), "model.layers.2147483648.input_layernorm.weight",
                "model.layers.0.mlp.experts.999999.gate_proj.weight",
                "model.layers.0.mlp.experts.gate_up_proj", edge_str(rng, outside),
            ))  # fmt: skip
            if isinstance(new_name, bytes):
                new_name = new_name.decode("latin-1")
            header = {(new_name if k == name else k): v for k, v in header.items()}
            what = f"renamed {name} to {new_name!r:.40}"
        elif field == "dtype":
            info["dtype"] = rng.choice(("F64", "I8", "F8_E4M3", "BF16", "F16", "", 1, None))
            what = f"{name} dtype {info['dtype']!r}"
        else:
            seq = list(info[field])
            i = rng.randrange(len(seq) + 1)
            if i == len(seq) or rng.random() < 0.2:
                seq = [*seq, edge_int(rng)] if rng.random() < 0.5 else seq[:-1]
            else:
                seq[i] = edge_int(rng, seq[i]) if rng.random() < 0.8 else json_value(rng, outside)
            info[field] = seq
            what = f"{name} {field} = {seq!r:.60}"
    elif op <= 7:
        header, what = mutate_json(rng, header, outside)
    else:
        length = rng.choice((0, 1, 7, 2**31, 2**63, 2**64 - 1, len(json.dumps(header)) - 1))
        what = f"header length {length}"
    raw, marks = S.serialize(header, data)
    if length is not None:
        n = struct.unpack("<Q", raw[:8])[0]
        choice = rng.choice((length, n - 1, n + 1, n - 8, n + 8))
        raw = struct.pack("<Q", choice % 2**64) + raw[8:]
        what = f"header length {choice} (was {n})"
    if rng.random() < 0.1:
        cut = rng.choice(marks) + rng.choice((0, -1, 1))
        raw = raw[: max(cut, 0)]
        what += f"; truncated at {cut}"
    shard.write_bytes(raw)
    return f"{shard.name}: {what}"


def _mutate_index(rng: random.Random, d: Path, outside: str) -> str:
    index = d / "model.safetensors.index.json"
    if not index.exists():
        return _mutate_shard(rng, d, outside)
    doc = json.loads(index.read_text())
    wm = doc["weight_map"]
    if rng.random() < 0.7:
        name = rng.choice(sorted(wm))
        wm[name] = escape(rng, outside) if rng.random() < 0.7 else json_value(rng, outside)
        what = f"index maps {name} to {wm[name]!r:.60}"
    else:
        doc, what = mutate_json(rng, doc, outside)
    _write_json(index, doc)
    return what


def _mutate_files(rng: random.Random, d: Path, outside: str) -> str:
    """File-system mutations: symlinks out of the directory, FIFOs, missing files."""
    target = rng.choice((*_shards(d), d / "tokenizer.json", d / "tokenizer_config.json",
                         d / "config.json", d / "generation_config.json",
                         d / "chat_template.jinja"))  # fmt: skip
    op = rng.randrange(5)
    if target.exists():
        target.unlink()
    if op == 0:
        os.symlink(Path(outside) / "secret.safetensors", target)
        return f"{target.name} -> the decoy outside"
    if op == 1:
        os.symlink(rng.choice(("/etc/passwd", "/proc/self/environ", "/dev/zero")), target)
        return f"{target.name} -> a system file"
    if op == 2:
        os.mkfifo(target)
        return f"{target.name} is a FIFO"
    if op == 3:
        target.mkdir()
        return f"{target.name} is a directory"
    os.symlink("../outside/secret.json", target)
    return f"{target.name} -> ../outside (relative)"


def _mutate_tokenizer(rng: random.Random, d: Path, outside: str) -> str:
    name = rng.choice(("tokenizer_config.json", "tokenizer.json", "generation_config.json"))
    path = d / name
    doc = json.loads(path.read_text())
    if name == "tokenizer_config.json" and rng.random() < 0.5:
        doc[rng.choice(("bos_token", "eos_token", "chat_template"))] = json_value(rng, outside)
        what = f"{name}: special token or template"
    else:
        doc, what = mutate_json(rng, doc, outside, prefer=("model", "decoder", "added_tokens"))
    _write_json(path, doc)
    return f"{name}: {what}"


def deep_json(rng: random.Random) -> str:
    """A document nested far deeper than any parser's recursion limit."""
    n = rng.choice((1000, 100_000))
    return '{"a": ' + "[" * n + "]" * n + "}"


def _mutate_nesting(rng: random.Random, d: Path, outside: str) -> str:
    name = rng.choice(("config.json", "model.safetensors.index.json", "tokenizer_config.json",
                       "tokenizer.json", "generation_config.json"))  # fmt: skip
    if (d / name).exists():
        (d / name).write_text(deep_json(rng))
    return f"{name} nested deeply"


def mutate_safetensors(rng: random.Random, seeds: Path, model_dir: Path) -> tuple[Path, str]:
    seed = rng.choice(sorted((seeds / "safetensors").iterdir()))
    shutil.rmtree(model_dir)
    shutil.copytree(seed, model_dir)
    outside = outside_dir(model_dir)
    done = [seed.name]
    # File-system changes last: the others read the files they edit.
    for op in sorted(rng.randrange(20) for _ in range(rng.choice((1, 1, 1, 2)))):
        fn = (_mutate_config if op < 6 else _mutate_shard if op < 12 else _mutate_index
              if op < 15 else _mutate_tokenizer if op < 17 else _mutate_nesting if op == 17
              else _mutate_files)  # fmt: skip
        try:
            done.append(fn(rng, model_dir, outside))
        except (ValueError, OSError, KeyError, TypeError, IndexError, AttributeError,
                struct.error):  # fmt: skip
            done.append(f"{fn.__name__} skipped (its input was already mutated)")
    return model_dir, "; ".join(done)


def _safetensors_action(entry: Path, index: int) -> None:
    # One mutant in four also goes through `colibri convert` and `colibri verify`.
    if index % 4 == 0:
        load_convert_verify(entry)
    else:
        load_and_generate(entry)


register(Format("safetensors", mutate_safetensors, _safetensors_action))


# ------------------------------------------------------------------------------ native

_NATIVE_TARGETS: tuple[tuple[str, Callable[[random.Random, dict[str, Any]], str]], ...] = (
    ("expert length", lambda r, m: _set_in(m["experts"], r, "length", r.choice(
        (2**33, 2**40, 4096 * 10**6, 0)))),
    ("crc null", lambda r, m: _set_in(r.choice((m["dense"], m["experts"])), r, "crc32",
                                      r.choice((None, -1, 2**32, "0", 1.5)))),
    ("rope permute", lambda r, m: _set_in(m["dense"], r, "rope_unpermute_heads",
                                          r.choice((True, 1, 2, -1, 2**31)))),
    ("arch", lambda r, m: _set(m["config"], "arch", r.choice(("abc", "", None, 1, "llama")))),
    ("n_experts", lambda r, m: _set(m["config"], "n_experts", edge_int(r))),
    ("n_layers", lambda r, m: _set(m["config"], "n_layers", edge_int(r))),
    ("expert width", lambda r, m: _set_in([e[r.choice(("gate", "up", "down"))]
                                           for e in m["experts"]], r, "shape",
                                          r.choice(([0, 64], [64], [], [2**31, 64])))),
    ("file name", lambda r, m: _set(m["files"][r.choice(("dense", "experts"))], "name",
                                    r.choice(("../outside/secret.safetensors", "/etc/passwd",
                                              "x.bin")))),
    ("tokenizer files", lambda r, m: _set(m, "tokenizer_files",
                                          r.choice((["../outside/secret.json"],
                                                    ["/etc/passwd"], "tokenizer.json", [1])))),
)  # fmt: skip


def _set(d: Any, key: str, value: Any) -> str:
    if isinstance(d, dict):
        d[key] = value
    return f"{key} = {value!r:.40}"


def _set_in(records: list[Any], rng: random.Random, key: str, value: Any) -> str:
    if not records:
        return "no records"
    return _set(rng.choice(records), key, value)


def _mutate_data(rng: random.Random, d: Path, outside: str) -> str:
    name = rng.choice(("dense.bin", "experts.bin"))
    path = d / name
    op = rng.randrange(4)
    if op <= 1 and path.stat().st_size:
        b = bytearray(path.read_bytes())
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(b))
        return f"flipped a bit of {name} at {i}"
    if op == 2:
        size = path.stat().st_size
        os.truncate(path, rng.randrange(size + 1) if size else 0)
        return f"truncated {name}"
    path.unlink()
    os.symlink(rng.choice((str(Path(outside) / "secret.safetensors"), "/dev/zero")), path)
    return f"{name} -> outside"


def mutate_native(rng: random.Random, seeds: Path, model_dir: Path) -> tuple[Path, str]:
    seed = rng.choice(sorted((seeds / "native").iterdir()))
    shutil.rmtree(model_dir)
    shutil.copytree(seed, model_dir)
    outside = outside_dir(model_dir)
    manifest = model_dir / "manifest.json"
    doc = json.loads(manifest.read_text())
    done = [seed.name]
    op = rng.randrange(10)
    if op < 3:
        label, fn = rng.choice(_NATIVE_TARGETS)
        done.append(f"{label}: {fn(rng, doc)}")
    elif op < 8:
        doc, what = mutate_json(rng, doc, outside,
                                prefer=("dense", "experts", "config", "files", "source"))
        done.append(what)
    elif op == 8:
        done.append(_mutate_data(rng, model_dir, outside))
    text = json.dumps(doc, allow_nan=True)
    if op == 9 and rng.random() < 0.2:
        text = deep_json(rng)
        done.append("manifest nested deeply")
    elif op == 9:
        cut = rng.randrange(len(text))
        text = text[:cut]
        done.append(f"manifest truncated at {cut}")
    manifest.write_text(text)
    return model_dir, "; ".join(done)


register(Format("native", mutate_native, verify_then_load))
