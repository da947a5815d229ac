"""The prompt cache (EngineConfig.prompt_cache): later calls sharing a token prefix reuse
its KV state and generate exactly what an uncached model generates (tokens and raw
logprobs bit for bit); entries stay within their bytes, least recently used first out;
the bytes come out of the RAM budget."""

from __future__ import annotations

import asyncio

import pytest

import colibri as co
from support.modelfactory import TinyModel
from support.realmodel import smollm2_gguf

LP = co.Sampling(logprobs=True, top_logprobs=2)


def _load(**engine: object) -> co.Model:
    return co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=1024, **engine))


@pytest.fixture(scope="module")
def plain() -> co.Model:
    return _load()


def test_chat_turns_reuse_the_history(plain: co.Model) -> None:
    cached = _load(prompt_cache="256MiB")
    history = [{"role": "system", "content": "You answer in one sentence."}]
    for question in ("What is a cat?", "And a dog?", "Which is bigger?"):
        history.append({"role": "user", "content": question})
        a = cached.generate(messages=history, max_tokens=16, sampling=LP)
        b = plain.generate(messages=history, max_tokens=16, sampling=LP)
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs  # bit for bit
        assert a.prompt_ids == b.prompt_ids
        history.append({"role": "assistant", "content": a.text})
    st = cached.prompt_cache.stats()
    assert st.hits == 2 and st.misses == 1 and st.entries == 1
    assert a.stats.cached_tokens > 0 and a.stats.cached_tokens + a.stats.prompt_tokens == len(
        a.prompt_ids)
    assert st.reused_tokens >= a.stats.cached_tokens
    assert 0 < st.bytes <= st.max_bytes == 256 << 20


def test_a_shared_prefix_is_copied_and_both_branches_stay(plain: co.Model) -> None:
    cached = _load(prompt_cache="256MiB")
    system = [{"role": "system", "content": "You are a terse geography tutor. " * 4}]
    outs = []
    for q in ("Capital of Peru?", "Capital of Chile?", "Capital of Peru?"):
        msgs = [*system, {"role": "user", "content": q}]
        g = cached.generate(messages=msgs, max_tokens=8)
        assert g.token_ids == plain.generate(messages=msgs, max_tokens=8).token_ids
        outs.append(g)
    st = cached.prompt_cache.stats()
    assert st.entries == 2 and st.hits == 2  # the second copied the prefix, the third found it
    assert outs[1].stats.cached_tokens < outs[2].stats.cached_tokens
    # Streams, the async calls and chat use the cache too.
    text = "".join(c.text for c in cached.stream_chat("Capital of Chile?", system=system[0][
        "content"], max_tokens=8))
    assert text == outs[1].text and cached.prompt_cache.stats().hits == 3
    cached.prompt_cache.clear()
    assert cached.prompt_cache.stats().entries == 0


def test_a_cancelled_call_leaves_no_entry_that_lost_its_tokens(plain: co.Model) -> None:
    """agenerate cancelled mid-decode rolls its session back after the stream closed; the
    cache must not keep that session as if it still held the call's tokens (a later call
    copied positions it no longer held: 'the source session holds 0')."""
    cached = _load(prompt_cache="256MiB")
    msgs = [{"role": "system", "content": "You are a terse geography tutor. " * 4},
            {"role": "user", "content": "Name five rivers of Peru."}]

    async def cancel_midway() -> None:
        task = asyncio.ensure_future(cached.agenerate(messages=msgs, max_tokens=400,
                                                           min_tokens=400))
        await asyncio.sleep(1.0)  # past the ~50-token prefill, inside the 400-token decode
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    for entry in cached.prompt_cache._entries:  # what is kept still holds its tokens
        assert entry.session.n_tokens == len(entry.tokens)
    again = cached.generate(messages=msgs, max_tokens=8)
    assert again.token_ids == plain.generate(messages=msgs, max_tokens=8).token_ids


def test_bytes_stay_within_the_cache_lru_first_out() -> None:
    probe = _load(prompt_cache="64MiB")
    probe.generate("word " * 60, max_tokens=1)
    one = probe.prompt_cache.stats().bytes
    cached = _load(prompt_cache=int(one * 2.5))
    for word in ("alpha", "beta", "gamma", "delta"):
        cached.generate(f"{word} " * 60, max_tokens=1)
        st = cached.prompt_cache.stats()
        assert st.bytes <= st.max_bytes
    st = cached.prompt_cache.stats()
    assert st.entries == 2 and st.evictions == 2
    # The two most recent are the ones kept.
    assert cached.generate("delta " * 60 + "x", max_tokens=1).stats.cached_tokens > 0
    assert cached.generate("alpha " * 60 + "x", max_tokens=1).stats.cached_tokens == 0
    tiny = _load(prompt_cache=one // 4)  # smaller than one entry: nothing is kept
    tiny.generate("word " * 60, max_tokens=1)
    assert tiny.prompt_cache.stats().entries == 0


def test_the_cache_is_part_of_the_ram_budget(tiny_models: dict[str, TinyModel]) -> None:
    src = tiny_models["qwen3_moe"].gguf["F32"]
    probe = co.Model.load(src, engine=co.EngineConfig(cache=co.CacheConfig(history=False)))
    mem = probe.stats().memory
    assert mem is not None and mem.prompt_cache_bytes == 0
    budget = mem.dense_bytes + mem.kv_bytes + mem.work_bytes + 12 * mem.slot_bytes
    a = co.Model.load(src, engine=co.EngineConfig(ram_budget=budget,
                                                  cache=co.CacheConfig(history=False)))
    b = co.Model.load(src, engine=co.EngineConfig(
        ram_budget=budget, prompt_cache=4 * mem.slot_bytes, cache=co.CacheConfig(history=False)))
    ma, mb = a.stats().memory, b.stats().memory
    assert ma is not None and mb is not None
    assert mb.prompt_cache_bytes == 4 * mem.slot_bytes
    assert mb.cache_slots == ma.cache_slots - 4  # the expert cache gave up the room
    assert "prompt cache" in repr(mb)


def test_changing_the_arithmetic_empties_the_cache(plain: co.Model) -> None:
    # Issue 35, item 8: entries computed under one activation precision (and KV type) must
    # not serve a call under another: a shared prefix then failed ("KV copy: the caches
    # differ"), an extended one silently reused the old numbers.
    cached = _load(prompt_cache="256MiB", activation_precision="int8")
    system = [{"role": "system", "content": "You are a terse geography tutor. " * 4}]
    peru = [*system, {"role": "user", "content": "Capital of Peru?"}]
    chile = [*system, {"role": "user", "content": "Capital of Chile?"}]
    cached.generate(messages=peru, max_tokens=8)
    assert cached.prompt_cache.stats().entries == 1
    cached.set_activation_precision("float32")  # f32 KV from now on, f16 before
    assert cached.prompt_cache.stats().entries == 0
    plain.set_activation_precision("float32")
    try:
        for msgs in (chile, peru, [*peru, {"role": "assistant", "content": "Lima."},
                                   {"role": "user", "content": "And of Chile?"}]):
            a = cached.generate(messages=msgs, max_tokens=8, sampling=LP)
            b = plain.generate(messages=msgs, max_tokens=8, sampling=LP)
            assert a.token_ids == b.token_ids and a.logprobs == b.logprobs  # bit for bit
        # A generation that began before a switch is not kept when it ends.
        stream = cached.stream(messages=chile, max_tokens=4)
        next(stream)
        entries = cached.prompt_cache.stats().entries
        cached.set_activation_precision("int8")
        list(stream)
        assert cached.prompt_cache.stats().entries == 0 < entries
    finally:
        plain.set_activation_precision("auto")
