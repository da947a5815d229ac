"""``colibri doctor [PATH]``: the machine's settings and disk speed for streaming, measured
through the engine's own read path (see colibri.engine.doctor and docs/cli.md)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any, TextIO

from ..engine.doctor import (
    DEFAULT_DEPTHS,
    MIB,
    has_model_data,
    measure_reads,
    model_data_file,
    probe_system,
    read_lines,
    report_dict,
    system_lines,
)
from ..errors import ConfigError, GPUUnavailableError
from ..gpu import adapter_lines, list_adapters


def add_doctor_parser(sub: Any, debug_flag: Any) -> None:
    doctor = sub.add_parser(
        "doctor", help="check this machine for streaming: disk, huge pages, memory, cores",
        description="Print the settings that decide how fast experts stream from disk "
                    "(O_DIRECT, transparent huge pages, readahead, request limits, the "
                    "cgroup memory limit, compute cores) and measure cold reads of PATH "
                    "(a model file or directory: its largest data file) through colibri's "
                    "own read path at several reads in flight, into huge-page and 4 KiB-page "
                    "buffers. The best huge-page figure is the disk bound of streaming.")
    doctor.add_argument("path", nargs="?", default=None, metavar="PATH",
                        help="a model file or directory on the disk to check (default: the "
                             "current directory; without a model file there, the settings "
                             "only)")
    doctor.add_argument("--no-measure", action="store_true",
                        help="only print the settings; read nothing")
    doctor.add_argument("--depths", type=int, nargs="+", default=list(DEFAULT_DEPTHS),
                        metavar="N", help="reads in flight to measure (default: 1 2 4 8)")
    doctor.add_argument("--read-mib", type=int, default=512, metavar="MIB",
                        help="MiB read per measured row (default: 512)")
    doctor.add_argument("--block-kib", type=int, default=4096, metavar="KIB",
                        help="size of one read in KiB, e.g. an expert's size (default: 4096)")
    doctor.add_argument("--json", action="store_true", help="print one JSON record")
    debug_flag(doctor, argparse.SUPPRESS)


def _gpu_report() -> tuple[list[str], dict[str, Any]]:
    """The GPU adapters, as lines and as a JSON record; a missing runtime is a line, not an
    error (the doctor reports the machine, a GPU is optional)."""
    try:
        adapters = list_adapters()
    except GPUUnavailableError as e:
        return [f"  none usable: {e}"], {"adapters": [], "error": str(e)}
    return adapter_lines(adapters), {"adapters": [asdict(a) for a in adapters], "error": None}


def cmd_doctor(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.read_mib < 1 or args.block_kib < 4:
        raise ConfigError("--read-mib must be >= 1 and --block-kib >= 4")
    path = "." if args.path is None else args.path
    system = probe_system(path)
    reads = None
    measure = not args.no_measure
    if measure and args.path is None and not has_model_data(path):
        # Asked about the machine, not a model: its settings, and how to measure a disk.
        err.write("colibri doctor: no model file here, so no reads were measured; pass one "
                  "(colibri doctor MODEL) to measure the disk it is on\n")
        measure = False
    if measure:
        file = model_data_file(path)
        if not args.json:
            err.write(f"measuring reads of {file} ...\n")
            err.flush()
        reads = measure_reads(file, depths=args.depths, block_bytes=args.block_kib * 1024,
                              bytes_per_row=args.read_mib * MIB)
    gpu_lines, gpu_record = _gpu_report()
    if args.json:
        out.write(json.dumps({**report_dict(system, reads), "gpu": gpu_record}) + "\n")
    else:
        out.write("colibri doctor\n")
        for line in system_lines(system) + (["", *read_lines(reads)] if reads else []):
            out.write(line + "\n")
        out.write("\n  GPU adapters (WebGPU: Vulkan, Metal, DX12):\n")
        for line in gpu_lines:
            out.write(line + "\n")
    out.flush()
    return 0
