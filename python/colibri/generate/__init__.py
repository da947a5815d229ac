"""Generation on a loaded engine: sessions, the decode loop and its records, requests and
their options, logprobs, structured output, asyncio, n samples, the prompt cache, prefix
sharing and continuous batching."""
