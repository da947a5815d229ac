"""Pieces shared by the commands: loading the model a command line names."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import TextIO

from ..hub import ResolvedModel, resolve_model
from ..model import Model
from .parser import engine_from_args


@dataclass
class Loaded:
    model: Model
    resolved: ResolvedModel
    load_seconds: float


def load_model(args: argparse.Namespace, err: TextIO, *, quiet: bool = False) -> Loaded:
    """Resolves ``--model`` (a path, a named model, or the default) and loads it with the
    engine flags. Download/build progress goes to `err` unless `quiet`."""
    engine = engine_from_args(args)
    resolved = resolve_model(args.model, args.cache_dir, log=None if quiet else err)
    t0 = time.perf_counter()
    model = Model.load(resolved.path, engine=engine)
    return Loaded(model, resolved, time.perf_counter() - t0)
