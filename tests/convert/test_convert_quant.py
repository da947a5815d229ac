"""``colibri convert --quant``: which tensors take the type, byte-exact agreement with
llama.cpp-style GGUFs of that type (tests/modelfactory.write_gguf), requantization through
float32, bounded row-chunk conversion, and resuming (docs/format.md, "Quantization")."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

import colibri
from colibri.cli import main as cli_main
from colibri.cli.parser import UsageError, build_parser
from colibri.convert import quantize, verify_container, write_container
from colibri.convert.container import JOURNAL, MANIFEST
from colibri.convert.quantize import target_dtype
from colibri.convert.source import tensor_reader
from colibri.errors import ConfigError, InvalidRequestError
from colibri.sources import Extent, Manifest, TensorInfo, open_model_source
from colibri.sources.native_source import load_native
from support.modelfactory import TinyModel, build_hf_model, prompt_ids

ENGINE = colibri.EngineConfig(context_length=64)
FLOAT32 = colibri.EngineConfig(context_length=64, activation_precision="float32")
QTYPES = {t: getattr(gguf.GGMLQuantizationType, t) for t in ("F32", "F16", "BF16", "Q8_0",
                                                               "Q4_0", "Q4_1")}  # fmt: skip


def logits(path: Path, engine: colibri.EngineConfig = ENGINE) -> np.ndarray:
    with colibri.Model.load(path, engine=engine) as m:
        return np.asarray(m.session().forward(prompt_ids(16), all_logits=True))


def tensor_bytes(m: Manifest, name: str) -> bytes:
    out = b""
    for e in m.tensors[name].extents:
        with open(m.files[e.file], "rb") as f:
            f.seek(e.offset)
            out += f.read(e.length)
    return out


def floats(m: Manifest, name: str) -> np.ndarray:
    """A manifest tensor's values as float32 (gguf's reference dequantizer)."""
    t = m.tensors[name]
    raw = np.frombuffer(tensor_bytes(m, name), dtype=np.uint8)
    cols = t.shape[-1]
    return gguf.quants.dequantize(raw, QTYPES[t.dtype]).reshape(-1, cols)


def container_files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def expected_kept_f32(name: str, shape: tuple[int, ...]) -> bool:
    """What stays F32 under any --quant but keep: llama.cpp's rule (modelfactory._keep_f32)."""
    return len(shape) < 2 or name.endswith("_norm") or "ffn_gate_inp" in name


# ------------------------------------------------------------------------------ choice


def test_target_dtype_rules() -> None:
    def t(name: str, shape: tuple[int, ...], dtype: str = "F32") -> TensorInfo:
        return TensorInfo(name, dtype, shape, (Extent(0, 0, 0),))

    assert target_dtype(t("blk.0.attn_q", (64, 64)), "q4_0") == "Q4_0"
    assert target_dtype(t("token_embd", (256, 64)), "q8_0") == "Q8_0"  # as convert_hf_to_gguf
    assert target_dtype(t("output", (256, 64)), "q4_1") == "Q4_1"
    assert target_dtype(t("blk.0.ffn_down_exps.3", (64, 32)), "q4_0") == "Q4_0"
    assert target_dtype(t("blk.0.attn_norm", (64,)), "q4_0") == "F32"
    assert target_dtype(t("blk.0.attn_q_norm", (32,), "BF16"), "bf16") == "F32"
    assert target_dtype(t("blk.0.attn_q.bias", (64,)), "q8_0") == "F32"
    assert target_dtype(t("blk.0.ffn_gate_inp", (8, 64)), "q8_0") == "F32"
    assert target_dtype(t("blk.0.ffn_gate_inp_shexp", (1, 64)), "q4_0") == "F32"
    # Rows that are not whole blocks fall back to F16, as llama.cpp's converter does.
    assert target_dtype(t("blk.0.ffn_down", (64, 48)), "q4_0") == "F16"
    assert target_dtype(t("blk.0.ffn_down", (64, 48)), "bf16") == "BF16"
    # keep: the source's type, whatever it is (no requantization).
    assert target_dtype(t("blk.0.ffn_gate_inp", (8, 64), "BF16"), "keep") == "BF16"
    # ... but vectors are widened to F32 (exact): the core reads norms and biases as F32.
    assert target_dtype(t("blk.0.attn_norm", (64,), "BF16"), "keep") == "F32"
    assert target_dtype(t("blk.0.attn_q.bias", (64,), "F16"), "keep") == "F32"
    assert target_dtype(t("blk.0.attn_q", (64, 64), "Q4_1"), "keep") == "Q4_1"
    with pytest.raises(ConfigError, match="iq9_k"):
        target_dtype(t("blk.0.attn_q", (64, 64)), "iq9_k")


def test_unknown_quant_is_refused(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="choose one of keep, f32"):
        write_container(tiny_models["llama"].hf_dir, tmp_path / "c", quant="Q4_K")
    assert not (tmp_path / "c").exists()


# ------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("kind", ["hf", "F32"])
def test_quantized_container_equals_the_gguf_of_that_type(
    tiny_model: TinyModel, qtype: str, kind: str, tmp_path: Path
) -> None:
    """An F32 source (Hugging Face or GGUF) converted with --quant q8_0 / q4_0 holds the
    bytes llama.cpp's converter writes for that type, so it computes exactly what that
    GGUF computes."""
    src = tiny_model.hf_dir if kind == "hf" else tiny_model.gguf["F32"]
    dst = tmp_path / "c"
    report = write_container(src, dst, quant=qtype.lower())
    assert report.quant == qtype.lower()
    assert verify_container(dst) == []
    nat, ref = load_native(dst), open_model_source(tiny_model.gguf[qtype])
    assert set(nat.tensors) == set(ref.tensors)
    for name, t in ref.tensors.items():
        n = nat.tensors[name]
        assert n.dtype == t.dtype == ("F32" if expected_kept_f32(name, t.shape) else qtype), name
        if kind == "F32":  # same row order (Q/K permuted for llama.cpp) as the reference
            assert n.rope_unpermute_heads == t.rope_unpermute_heads
            assert tensor_bytes(nat, name) == tensor_bytes(ref, name), name
    np.testing.assert_array_equal(logits(dst), logits(tiny_model.gguf[qtype]))
    assert json.loads((dst / MANIFEST).read_text())["quant"] == qtype.lower()


@pytest.mark.parametrize("kind", ["hf", "F32"])
def test_f32_is_bit_exact(tiny_models: dict[str, TinyModel], kind: str, tmp_path: Path) -> None:
    t = tiny_models["qwen2_moe"]
    src = t.hf_dir if kind == "hf" else t.gguf["F32"]
    write_container(src, tmp_path / "keep")
    write_container(src, tmp_path / "f32", quant="f32")
    a, b = load_native(tmp_path / "keep"), load_native(tmp_path / "f32")
    for name in a.tensors:
        assert b.tensors[name].dtype == "F32"
        assert tensor_bytes(a, name) == tensor_bytes(b, name), name
    np.testing.assert_array_equal(logits(tmp_path / "f32"), logits(src))


def test_f16_and_bf16_round_like_numpy_and_gguf(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    t = tiny_models["mixtral"]
    src = open_model_source(t.hf_dir)
    for q in ("f16", "bf16"):
        write_container(src, tmp_path / q, quant=q)
        nat = load_native(tmp_path / q)
        for name, info in src.tensors.items():
            x = floats(src, name)
            n = nat.tensors[name]
            if expected_kept_f32(name, info.shape):
                assert n.dtype == "F32" and tensor_bytes(nat, name) == x.tobytes(), name
                continue
            assert n.dtype == q.upper(), name
            want = gguf.quants.quantize(x, QTYPES[q.upper()])  # numpy's f16; RNE bf16
            assert tensor_bytes(nat, name) == want.tobytes(), name
        # Half-precision weights: close to the F32 model, not equal.
        np.testing.assert_allclose(logits(tmp_path / q), logits(t.hf_dir), atol=0.05, rtol=0)


def test_requantizing_goes_through_f32(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    """Q8_0 -> Q4_0 is dequantize -> quantize (both roundings): exactly
    gguf.quants.quantize(gguf.quants.dequantize(q8)); a Q8_0 -> f32 container holds the
    dequantized values and computes what its source's weights are."""
    t = tiny_models["olmoe"]
    src = open_model_source(t.gguf["Q8_0"])
    write_container(src, tmp_path / "q4", quant="q4_0")
    write_container(src, tmp_path / "f32", quant="f32")
    q4, f32 = load_native(tmp_path / "q4"), load_native(tmp_path / "f32")
    for name, info in src.tensors.items():
        x = floats(src, name)
        assert tensor_bytes(f32, name) == x.tobytes(), name
        want = x if info.dtype == "F32" else gguf.quants.quantize(x, QTYPES["Q4_0"])
        assert q4.tensors[name].dtype == ("F32" if info.dtype == "F32" else "Q4_0")
        assert tensor_bytes(q4, name) == want.tobytes(), name
    # The weights of the Q8_0 GGUF: with float activations (weights dequantized row by
    # row for the Q8_0 file) the two compute the same thing up to summation order.
    a, b = logits(tmp_path / "f32", FLOAT32), logits(t.gguf["Q8_0"], FLOAT32)
    assert float(np.abs(a - b).max()) <= 1e-5 * float(np.abs(b).max())


def test_bf16_source(tmp_path: Path) -> None:
    """A BF16 checkpoint: keep copies its matrices and widens its norms to F32 (the core
    reads no other vector type, so the checkpoint itself cannot be loaded); q8_0 quantizes
    the BF16 values."""
    import torch

    hf = tmp_path / "hf"
    build_hf_model("qwen3_moe").to(torch.bfloat16).save_pretrained(hf, safe_serialization=True)
    for q in ("keep", "f32", "q8_0"):
        write_container(hf, tmp_path / q, quant=q)
    src = open_model_source(hf)
    keep, f32, q8 = (load_native(tmp_path / q) for q in ("keep", "f32", "q8_0"))
    for name, info in src.tensors.items():
        x = floats(src, name)
        assert tensor_bytes(f32, name) == x.tobytes()
        if len(info.shape) < 2:
            assert keep.tensors[name].dtype == "F32" and tensor_bytes(keep, name) == x.tobytes()
        else:
            assert keep.tensors[name].dtype == "BF16"
            assert tensor_bytes(keep, name) == tensor_bytes(src, name)
        if expected_kept_f32(name, info.shape):
            assert q8.tensors[name].dtype == "F32" and tensor_bytes(q8, name) == x.tobytes()
        else:
            want = gguf.quants.quantize(x, QTYPES["Q8_0"]).tobytes()
            assert tensor_bytes(q8, name) == want, name
    a, b = logits(tmp_path / "keep", FLOAT32), logits(tmp_path / "f32", FLOAT32)
    assert float(np.abs(a - b).max()) <= 1e-5 * float(np.abs(b).max())


def test_conversion_is_chunked_by_rows(
    tiny_models: dict[str, TinyModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Converting a few rows at a time (here 100 values: one or two rows) writes the
    same bytes as whole tensors at once: memory is bounded by the chunk, not the tensor."""
    src = tiny_models["qwen2_moe"].gguf["Q8_0"]
    write_container(src, tmp_path / "whole", quant="q4_1")
    seen: list[int] = []
    convert = quantize.decode

    def spy(dtype: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
        seen.append(rows * cols)
        return convert(dtype, raw, rows, cols)

    monkeypatch.setattr(quantize, "CHUNK_ELEMENTS", 100)
    monkeypatch.setattr(quantize, "decode", spy)
    write_container(src, tmp_path / "rows", quant="q4_1")
    assert max(seen) <= 128  # the widest row (128 values) when a row exceeds the chunk
    assert container_files(tmp_path / "rows") == container_files(tmp_path / "whole")


def test_reader_spans_extents(tmp_path: Path) -> None:
    f = tmp_path / "data"
    f.write_bytes(bytes(range(100)))
    t = TensorInfo("x", "F32", (6,), (Extent(0, 10, 8), Extent(0, 50, 16)))
    with open(f, "rb") as fh:
        read = tensor_reader([fh], [f])
        assert bytes(read(t, 0, 24)) == bytes(range(10, 18)) + bytes(range(50, 66))
        assert bytes(read(t, 6, 6)) == bytes([16, 17, 50, 51, 52, 53])
        assert bytes(read(t, 8, 4)) == bytes(range(50, 54))


# ------------------------------------------------------------------------------ resuming


class Interrupt(Exception):
    pass


def stop_after(n: int):  # type: ignore[no-untyped-def]
    calls = [0]

    def progress(done: int, total: int) -> None:
        calls[0] += 1
        if calls[0] > n:  # the first call reports the resume check
            raise Interrupt

    return progress


@pytest.mark.parametrize("kind", ["hf", "Q8_0"])
def test_quantized_resume_is_byte_identical(
    tiny_models: dict[str, TinyModel], kind: str, tmp_path: Path
) -> None:
    t = tiny_models["qwen3_moe"]
    src = t.hf_dir if kind == "hf" else t.gguf["Q8_0"]
    ref = tmp_path / "ref"
    write_container(src, ref, quant="q4_0")
    n_dense = len(json.loads((ref / MANIFEST).read_text())["dense"])
    dst = tmp_path / "dst"
    stop = n_dense + 5
    with pytest.raises(Interrupt):
        write_container(src, dst, quant="q4_0", progress=stop_after(stop))
    assert json.loads((dst / JOURNAL).read_text().splitlines()[0])["quant"] == "q4_0"
    # Another --quant refuses (a colibri error) and leaves the interrupted work alone.
    before = container_files(dst)
    with pytest.raises(InvalidRequestError, match=r"--quant q4_0 to resume"):
        write_container(src, dst, quant="q8_0")
    with pytest.raises(InvalidRequestError, match="interrupted conversion"):
        write_container(src, dst)  # keep
    assert container_files(dst) == before
    report = write_container(src, dst, quant="q4_0")
    assert (report.items_reused, report.items_written) == (stop, report.items_total - stop)
    assert container_files(dst) == container_files(ref)
    # Finished: a new conversion with another type is an ordinary rewrite.
    write_container(src, dst, quant="q8_0")
    assert json.loads((dst / MANIFEST).read_text())["quant"] == "q8_0"


# ------------------------------------------------------------------------------ CLI


def test_convert_options_and_command(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    """cmd_convert with the options add_convert_options declares (what cli/parser.py
    wires into ``colibri convert``)."""
    import argparse
    import io

    from colibri.cli.convert import add_convert_options, cmd_convert

    p = argparse.ArgumentParser()
    p.add_argument("source")
    p.add_argument("dest")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("--cache-dir", default=None)
    add_convert_options(p)
    t = tiny_models["qwen3_moe"]
    dst = tmp_path / "c"
    out, err = io.StringIO(), io.StringIO()
    args = p.parse_args([str(t.hf_dir), str(dst), "--quant", "q8_0"])
    assert cmd_convert(args, out, err) == 0
    assert "(--quant q8_0)" in out.getvalue() and "converting (q8_0)" in err.getvalue()
    np.testing.assert_array_equal(logits(dst), logits(t.gguf["Q8_0"]))
    assert p.parse_args(["a", "b"]).quant == "keep"
    with pytest.raises(SystemExit):
        p.parse_args(["a", "b", "--quant", "iq9_k"])
    assert p.parse_args(["a", "b", "--quant", "q4_k_m"]).quant == "q4_k_m"


def _parser_has_quant() -> bool:
    try:
        build_parser("0").parse_args(["convert", "SRC", "DST", "--quant", "q8_0"])
    except UsageError:
        return False
    return True


@pytest.mark.skipif(
    not _parser_has_quant(), reason="cli/parser.py does not add convert's --quant yet"
)
def test_cli_convert_quant(
    tiny_models: dict[str, TinyModel], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tiny_models["mixtral"]
    dst = tmp_path / "c"
    assert cli_main(["convert", "-q", "--quant", "q4_0", str(t.gguf["F32"]), str(dst)]) == 0
    assert "(--quant q4_0)" in capsys.readouterr().out
    np.testing.assert_array_equal(logits(dst), logits(t.gguf["Q4_0"]))
    assert cli_main(["convert", "--quant", "q9", str(t.gguf["F32"]), str(dst)]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_container_to_container(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    """A container is a source too (e.g. requantize a keep container); converting into
    the source's own directory is refused."""
    t = tiny_models["qwen2_moe"]
    write_container(t.hf_dir, tmp_path / "keep")
    write_container(tmp_path / "keep", tmp_path / "q8", quant="q8_0")
    write_container(t.hf_dir, tmp_path / "ref", quant="q8_0")
    a, b = container_files(tmp_path / "q8"), container_files(tmp_path / "ref")
    assert a.keys() == b.keys()
    assert all(a[k] == b[k] for k in a if k != MANIFEST)  # manifest.json: the source name
    assert load_native(tmp_path / "q8").tensors == load_native(tmp_path / "ref").tensors
    with pytest.raises(InvalidRequestError, match="source's own files"):
        write_container(tmp_path / "keep", tmp_path / "keep", quant="q4_0")
    assert verify_container(tmp_path / "keep") == []


def test_resume_after_sigkill(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    """A conversion killed outright (SIGKILL: no exception handler, no buffered write
    flushed at exit) resumes to the same bytes."""
    import signal
    import subprocess
    import sys

    src = tiny_models["mixtral"].gguf["F32"]
    ref, dst = tmp_path / "ref", tmp_path / "dst"
    write_container(src, ref, quant="q4_1")
    code = (
        "import os, signal, sys\n"
        "from colibri.convert import write_container\n"
        "n = [0]\n"
        "def progress(done, total):\n"
        "    n[0] += 1\n"
        "    if n[0] > 20:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "write_container(sys.argv[1], sys.argv[2], quant='q4_1', progress=progress)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(src), str(dst)], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert not (dst / MANIFEST).exists()
    report = write_container(src, dst, quant="q4_1")
    assert report.items_reused == 20
    assert container_files(dst) == container_files(ref)
