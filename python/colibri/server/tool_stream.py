"""Tool calls streamed as the model writes them (docs/serving.md, Tool calls).

:class:`ToolStream` takes an answer's text piece by piece and returns what a stream sends:
content text (``str``) until the first call marker, then :class:`CallStart` (a call's
index, id and name) and :class:`CallArgs` (a fragment of its arguments' JSON) as the
format's incremental reader (colibri.server.tool_stream_readers) finds them. At the end,
:meth:`ToolStream.finish` parses the whole answer exactly as the non-streamed response
does (tools.split_answer) and settles the stream with it:

- a call the stream opened gets the rest of its arguments, so the concatenated fragments
  are the parse's ``arguments`` string (``json.dumps`` of the arguments: the readers write
  fragments that way);
- a call the parse found that the stream did not open (a format without an incremental
  reader, a reader that gave up on something it did not expect) is sent whole;
- the content the parse leaves (text after the calls, a malformed call's text) is sent,
  so the streamed text is the non-streamed content. Three differences the stream cannot
  avoid, having sent already: whitespace at the very start of an answer with calls (the
  non-streamed content is stripped); an object with a repeated key (sent twice; the
  non-streamed string has the last, ``json.loads`` of both is the same); and a call that
  had opened and then did not parse (its arguments went bad, or the output ended inside
  them): it stays in the stream with the arguments sent so far, a valid JSON prefix, and
  its text is also sent as content, as the non-streamed content has it; the finish reason
  is the non-streamed one. A call opens only once its first argument's value begins, so a
  call with a wrong header or first key never opens.

Memory: the answer's text (which the non-streamed parse needs too), and what a reader
holds (colibri.server.tool_stream_readers); text before the first call is sent at once,
but for a possible marker's start and a trailing whitespace run (sent with the next text,
or not at all when the calls follow it and the non-streamed content strips it).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .tool_formats import FORMATS, ToolCall
from .tool_stream_readers import READERS, CallOpened, CallReader
from .tools import split_answer

__all__ = ["CallArgs", "CallStart", "StreamEvent", "ToolStream"]


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str


StreamEvent = str | CallStart | CallArgs


@dataclass
class _Opened:
    index: int
    at: int
    name: str
    sent: list[str] = field(default_factory=list)


class ToolStream:
    """One answer's stream in tool-call format `fmt` (a FORMATS name); `id_prefix` begins
    the ids it makes (``call_``, ``toolu_``)."""

    def __init__(self, fmt: str, tools: Sequence[dict[str, Any]] | None = None,
                 id_prefix: str = "call_") -> None:
        self._format = FORMATS[fmt]
        self._tools = tools
        self._prefix = id_prefix
        self._make = READERS.get(fmt)
        self._reader: CallReader | None = None
        self._all: list[str] = []
        self._length = 0
        self._held = ""  # a possible marker's start, before the first call
        self._ws: list[str] = []  # trailing whitespace not sent yet, before the first call
        self._sent: list[str] = []
        self._in_calls = False
        self._opened: list[_Opened] = []
        # The text before these is surely content: the format's call openings, and its
        # section markers (which the parse deletes from the content once a call parsed).
        self._marks = tuple(dict.fromkeys(self._format.opens + self._format.section))
        self.calls: list[ToolCall] = []
        self.dropped = False

    def feed(self, text: str) -> list[StreamEvent]:
        if not text:
            return []
        self._all.append(text)
        self._length += len(text)
        if self._in_calls:
            return self._read(text)
        buf = self._held + text
        found = [i for i in (buf.find(o) for o in self._marks) if i >= 0]
        if found:
            i = min(found)
            self._in_calls, self._held = True, ""
            if self._make is not None:
                self._reader = self._make(self._tools, self._length - len(buf) + i)
            return self._text(buf[:i]) + self._read(buf[i:])
        # Hold back the longest suffix that could start a marker.
        keep = max((k for o in self._marks
                    for k in range(min(len(o) - 1, len(buf)), 0, -1)
                    if o.startswith(buf[-k:])), default=0)
        self._held = buf[len(buf) - keep:] if keep else ""
        return self._text(buf[:len(buf) - keep])

    def _text(self, text: str) -> list[StreamEvent]:
        body = text.rstrip()
        if not body:
            if text:
                self._ws.append(text)
            return []
        out = "".join(self._ws) + body
        self._ws = [text[len(body):]] if len(body) < len(text) else []
        self._sent.append(out)
        return [out]

    def _read(self, text: str) -> list[StreamEvent]:
        if self._reader is None:
            return []
        out: list[StreamEvent] = []
        for got in self._reader.feed(text):
            if isinstance(got, CallOpened):
                call = _Opened(len(self._opened), got.at, got.name)
                self._opened.append(call)
                out.append(CallStart(call.index, got.call_id or self._new_id(), got.name))
            else:
                self._opened[-1].sent.append(got)
                out.append(CallArgs(self._opened[-1].index, got))
        return out

    def _new_id(self) -> str:
        return f"{self._prefix}{uuid.uuid4().hex[:24]}"

    def finish(self, cut: bool = False, raw_without_calls: bool = False,
               ) -> list[StreamEvent]:
        """The stream's last events, from the whole answer's parse (:func:`split_answer`
        with `cut`: max_tokens ended the answer); :attr:`calls` and :attr:`dropped` are
        the parse's. `raw_without_calls`: the non-streamed content is the unparsed text
        when there are no calls (OpenAI's message), else the parse's stripped rest
        (Anthropic's)."""
        full = "".join(self._all)
        content, self.calls, self.dropped = split_answer(full, self._format.name, self._tools,
                                                         self._prefix, cut)
        final = full if raw_without_calls and not (self.calls or self.dropped) else content
        out: list[StreamEvent] = []
        matched = self._match(full)
        for i, call in enumerate(self.calls):
            opened = matched.get(i)
            if opened is not None:
                args, sent = _arguments(call), "".join(opened.sent)
                if args.startswith(sent) and len(args) > len(sent):
                    out.append(CallArgs(opened.index, args[len(sent):]))
        sent = "".join(self._sent)
        if not final.startswith(sent):
            sent = sent.lstrip()  # the parse stripped what the stream sent first
        if final.startswith(sent) and len(final) > len(sent):
            out.append(final[len(sent):])
        index = len(self._opened)
        for i, call in enumerate(self.calls):
            if i not in matched:
                out += [CallStart(index, call.id, call.name), CallArgs(index, _arguments(call))]
                index += 1
        return out

    def _match(self, full: str) -> dict[int, _Opened]:
        """The parse's calls (by index) that the stream opened: the same start in the
        answer, the same name. A call with an empty span at the previous call's end (the
        later calls of a Mistral list) starts where that call does, as its reader says."""
        if not self._opened:
            return {}
        fmt = self._format
        spans = [(start, end) for start, end, fields in fmt.scan(full)
                 if fmt.read(fields, self._tools) is not None]
        if len(spans) != len(self.calls):  # not the parse's calls: match none
            return {}
        by_start: dict[int, list[_Opened]] = {}
        for c in self._opened:
            by_start.setdefault(c.at, []).append(c)
        out = {}
        key, last_end = -1, -1
        for i, ((start, end), call) in enumerate(zip(spans, self.calls, strict=True)):
            if not (start == end == last_end):
                key = start
            last_end = end
            waiting = by_start.get(key)
            if waiting and waiting[0].name == call.name:
                out[i] = waiting.pop(0)
        return out


def _arguments(call: ToolCall) -> str:
    return call.openai()["function"]["arguments"]  # type: ignore[no-any-return]
