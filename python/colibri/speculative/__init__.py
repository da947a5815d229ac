"""Speculative decoding: drafts verified in one batched forward, exact by construction
(``docs/speculative.md``)."""

from __future__ import annotations

from ..settings.spec import MAX_DRAFT, MAX_NGRAM, SpecConfig, as_spec
from .drafters import Drafter, MtpDrafter, PromptLookupDrafter
from .stats import SpecStats
from .verify import Speculator

__all__ = ["MAX_DRAFT", "MAX_NGRAM", "Drafter", "MtpDrafter", "PromptLookupDrafter", "SpecConfig",
           "SpecStats", "Speculator", "as_spec"]
