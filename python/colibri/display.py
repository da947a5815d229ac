"""How colibri's objects show themselves: short reprs for people (sizes in KiB/MiB/GiB,
rates and durations to 3 significant digits), a multi-line form for IPython's pretty
printer (``_repr_pretty_``) and an HTML table for notebooks (``_repr_html_``).

A class mixes in :class:`Displayable` and says what to show in ``_display_rows``: a list
of ``(label, value text)``. The exact numbers stay in the fields (and ``to_dict()``).
"""

from __future__ import annotations

import html
from typing import Any

from .sizes import format_bytes

__all__ = ["Displayable", "duration", "percent", "sig3", "size"]


def sig3(x: float) -> str:
    """Three significant digits: ``242``, ``42.6``, ``0.00245``, ``1.23e+04`` -> ``12300``."""
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def size(n: int) -> str:
    return format_bytes(int(n))


def duration(seconds: float) -> str:
    """``"1.25 s"``, ``"120 ms"``, ``"2.45 µs"``: three significant digits."""
    if seconds <= 0:
        return "0 s"
    if seconds >= 1:
        return f"{sig3(seconds)} s"
    if seconds >= 1e-3:
        return f"{sig3(seconds * 1e3)} ms"
    return f"{sig3(seconds * 1e6)} µs"


def percent(x: float) -> str:
    return f"{100 * x:.1f}%"


class Displayable:
    """``repr`` as ``Name(label value, ...)``; pretty and HTML forms as a table."""

    def _display_rows(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def _display_title(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        rows = self._display_rows()
        return f"{self._display_title()}({', '.join(f'{k} {v}' if k else v for k, v in rows)})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """IPython's pretty printer: one row per line."""
        if cycle:
            p.text(f"{self._display_title()}(...)")
            return
        rows = self._display_rows()
        width = max((len(k) for k, _ in rows), default=0)
        lines = [self._display_title()] + [f"  {k:<{width}}  {v}" for k, v in rows]
        p.text("\n".join(lines))

    def _repr_html_(self) -> str:
        """Jupyter: a two-column table."""
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in self._display_rows()
        )
        title = html.escape(self._display_title())
        return f"<table><caption style='text-align:left'><b>{title}</b></caption>{body}</table>"


# --- rows of the objects that live in modules importing this one (duck-typed, no cycles) --


def model_rows(model: Any) -> list[tuple[str, str]]:
    """Rows of a :class:`colibri.Model`."""
    c = model.config
    rows = [("name", repr(model.name))]
    if model.closed:
        return [*rows, ("", "closed")]
    kind = (f"MoE, {c.n_experts} experts, top-{c.n_experts_per_tok}" if c.n_experts
            else "dense")
    rows += [
        ("architecture", f"{c.arch} ({kind}), {c.n_layers} layers, hidden {c.hidden_size}, "
                         f"vocab {c.vocab_size}"),
        ("context", f"{model.context_length} tokens"),
        ("source", f"{model.manifest.source} {model.manifest.path}"),
    ]
    memory = model.stats().memory
    if memory is not None:
        rows.append(("memory", memory.summary()))
    t = model.threads
    rows.append(("threads", f"{t.team_size()} ({t.wait_policy.value}), activations "
                            f"{model.engine_config.activation_precision.value}"))
    return rows


def model_stats_rows(s: Any) -> list[tuple[str, str]]:
    """Rows of a :class:`colibri.ModelStats`."""
    rows = [
        ("generations", str(s.generations)),
        ("prompt", f"{s.prompt_tokens} tokens ({sig3(s.prefill_tok_s)} tok/s)"),
        ("generated", f"{s.generated_tokens} tokens (decode {sig3(s.decode_tok_s)} tok/s)"),
    ]
    if s.experts.lookups:
        rows.append(("experts", s.experts.summary()))
    if s.memory is not None:
        rows.append(("memory", s.memory.summary()))
    if s.wait_policy:
        rows.append(("wait policy", s.wait_policy))
    if getattr(s, "prefetch", ""):
        rows.append(("prefetch", s.prefetch))
    if getattr(s, "io", ""):
        rows.append(("expert reads", s.io))
    gpu = getattr(s, "gpu", None)
    if gpu is not None:
        rows.append(("gpu", f"{gpu.adapter}: {len(gpu.on_gpu)} matrices, {gpu.dispatches} "
                            "dispatches"))
    spec = getattr(s, "spec", None)
    if spec is not None:
        rows.append(("speculative", f"{spec.drafter}: {spec.accepted}/{spec.drafted} drafts "
                                    f"accepted, {sig3(spec.tokens_per_forward)} tokens per "
                                    "forward"))
    return rows
