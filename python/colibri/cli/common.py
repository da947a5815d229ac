"""Pieces shared by the commands: loading the model a command line names."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import TextIO

from ..model import Model
from ..models.hub import ResolvedModel
from ..models.resolve import resolve_model_spec
from .parser import engine_from_args


@dataclass
class Loaded:
    model: Model
    resolved: ResolvedModel
    load_seconds: float


def load_model(args: argparse.Namespace, err: TextIO, *, quiet: bool = False) -> Loaded:
    """Resolves ``--model`` (a path, a named model, a Hugging Face repository id in the
    local cache, or the default) the way ``Model.load`` does and loads it with the engine
    flags. Download/build progress goes to `err` unless `quiet`."""
    engine = engine_from_args(args)
    resolved = resolve_model_spec(args.model, cache_dir=args.cache_dir, download=args.download,
                                  download_option="--download",
                                  log=None if quiet else err)
    t0 = time.perf_counter()
    model = Model.load(resolved.path, engine=engine, progress=False)
    return Loaded(model, resolved, time.perf_counter() - t0)
