"""Helpers shared by the tests: tiny model factories (modelfactory, deepseek_factory,
fp8_factory), real-weight fixtures, oracles (ggml_oracle, llamacpp_quant), server and
streaming helpers. Not tests themselves."""
