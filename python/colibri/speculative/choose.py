"""Which drafter a SpecConfig means for a given session: lookup for every model, the MTP
layer for a model that has one (DeepSeek-V3, GLM-4.5, GLM-5)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..settings.spec import SpecConfig
from .auto import CostMemory
from .drafters import Drafter, MtpDrafter, PromptLookupDrafter
from .verify import Speculator

if TYPE_CHECKING:
    from .. import _core

__all__ = ["speculator_for"]


def speculator_for(config: SpecConfig, session: _core.Session, mtp_layers: int,
                   model_name: str = "the model",
                   memory: CostMemory | None = None) -> Speculator | None:
    """The Speculator of one generation on `session` (None when drafting is off).
    ``"mtp"`` needs the model's MTP layer; ``"auto"`` takes it when there is one (the cost
    rule then decides per step whether its drafts pay), else prompt lookup. `memory`: the
    model's CostMemory ("auto" starts from the cost earlier generations measured)."""
    if not config.enabled:
        return None
    use_mtp = config.drafter == "mtp" or (config.drafter == "auto" and mtp_layers > 0)
    if config.drafter == "mtp" and mtp_layers <= 0:
        raise ConfigError(f"SpecConfig.drafter='mtp': {model_name} has no multi-token-"
                          "prediction layers (num_nextn_predict_layers); use 'lookup' or "
                          "'auto'")
    drafter: Drafter = MtpDrafter(session) if use_mtp else PromptLookupDrafter(
        config.ngram_sizes)
    kind = "mtp" if use_mtp else "lookup"
    name = f"auto ({kind})" if config.drafter == "auto" else kind
    return Speculator(config, drafter, name, memory)
