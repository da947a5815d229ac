"""Does the destination of an O_DIRECT read change the disk's speed? (session 26)

Reads `--reads` random slot-aligned extents of one expert slot through the engine's read
pool (2 workers, one read on the device at a time: IOConfig.max_in_flight = 1) into 1, 64
or 400 huge-page slabs, used in turn. The disk bound of bench_streaming.py reads into as
many slabs as reads in flight (1 at depth 1), while a decode reads into the expert cache's
hundreds of slots. Run under the quiet lock:

    flock /work/wt/quiet.lock chrt -f 10 env PYTHONPATH=python:build/dev/io \\
      .venv/bin/python benchmarks/bench_slab_reuse.py build/bench-data/<model>.colibri/experts.bin
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _diskbound as db
from colibri import _core


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="the file to read (a native container's experts.bin)")
    ap.add_argument("--block", type=int, default=2654208,
                    help="bytes per read (moe-8g: one expert)")
    ap.add_argument("--reads", type=int, default=600)
    ap.add_argument("--slabs", default="1,64,400")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cio = _core.io
    block = -(-args.block // cio.DIRECT_ALIGNMENT) * cio.DIRECT_ALIGNMENT
    for rep in range(args.repeats):
        for slabs in (int(s) for s in args.slabs.split(",")):
            size = os.path.getsize(args.path)
            offs = db.slot_offsets(size, block, args.reads, seed=rep * 10 + slabs)
            db.evict(args.path)
            with cio.ReadPool([args.path], workers=2, direct=True) as pool:
                pool.max_in_flight = 1
                secs = float(pool.bench(0, offs, block, slabs, hugepages=True))
                s = pool.stats()
            print(f"repeat {rep} slabs {slabs:4d}: {len(offs) * block / secs / 1e9:.2f} GB/s, "
                  f"{s['bytes'] / s['busy_seconds'] / 1e9:.2f} GB/s while a read was on the device")


if __name__ == "__main__":
    main()
