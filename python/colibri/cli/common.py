"""Pieces shared by the commands: loading the model a command line names."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import TextIO

from ..model import Model
from ..models.hub import ResolvedModel
from ..models.resolve import resolve_model_spec
from ..progress import delayed_bar
from .parser import engine_from_args


@dataclass
class Loaded:
    model: Model
    resolved: ResolvedModel
    load_seconds: float


def load_model(args: argparse.Namespace, err: TextIO, *, quiet: bool = False) -> Loaded:
    """Resolves ``--model`` (a path, a named model, a Hugging Face repository id in the
    local cache, or the default) the way ``Model.load`` does and loads it with the engine
    flags. Download/build progress goes to `err` unless `quiet`; so does, when `err` is a
    terminal, a "loading" line once the load has run a second (erased when it ends)."""
    engine = engine_from_args(args)
    resolved = resolve_model_spec(args.model, cache_dir=args.cache_dir, download=args.download,
                                  download_option="--download",
                                  log=None if quiet else err)
    bar = delayed_bar(False if quiet else None,
                      f"colibri: loading {resolved.name or resolved.path.name}", out=err)
    t0 = time.perf_counter()
    if bar is None:
        model = Model.load(resolved.path, engine=engine, progress=False)
    else:
        with bar:
            model = Model.load(resolved.path, engine=engine, progress=False)
    return Loaded(model, resolved, time.perf_counter() - t0)
