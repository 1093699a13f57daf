#!/usr/bin/env python3
"""Checks that include/decentrain's folders use only the layers below them (DESIGN's table).

Each folder's headers may include the folders listed for it (and the files at the top,
config.hpp and fwd.hpp); any other `#include "decentrain/..."` is named with its file and line,
and the script exits 1. Run with no arguments from anywhere; --root DIR checks another tree.
"""
import argparse
import pathlib
import re
import sys

BASE = {"config.hpp", "fwd.hpp"}
# What each folder may use: the layers below it, written out (no layer is implied).
BELOW = {
    "detail": set(),
    "core": {"detail"},
    "kernels": {"core", "detail"},
    "autograd": {"kernels", "core", "detail"},
    "nn": {"autograd", "kernels", "core", "detail"},
    "optim": {"autograd", "kernels", "core", "detail"},
    "data": {"autograd", "kernels", "core", "detail", "io"},  # token shards are files
    "io": {"core", "detail"},
    "transport": {"io", "core", "detail"},
    "compress": {"io", "kernels", "core", "detail"},  # codecs only: no collective, no transport
    "collective": {"compress", "transport", "io", "kernels", "core", "detail"},
}
POLICIES = {"comm", "parallel", "fault"}  # the slots: each uses everything above, not each other
BELOW.update({p: set(BELOW) | {"collective", "nn", "optim", "data"} for p in POLICIES})
BELOW["train"] = set(BELOW) | POLICIES

INCLUDE = re.compile(r'^\s*#\s*include\s+"decentrain/([^"/]+)(/[^"]*)?"')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=pathlib.Path(__file__).resolve().parent.parent)
    root = pathlib.Path(parser.parse_args().root) / "include" / "decentrain"
    if not root.is_dir():
        sys.exit(f"check_layers: no folder {root}")
    wrong, seen = [], set()
    for path in sorted(root.rglob("*")):
        if path.suffix not in {".hpp", ".cuh", ".h"} or path.parent == root:
            continue
        layer = path.relative_to(root).parts[0]
        if layer not in BELOW:
            wrong.append(f"{path}: folder '{layer}' is in no layer (add it to scripts/check_layers.py and DESIGN)")
            continue
        seen.add(layer)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            used = m.group(1)
            if m.group(2) is None and used in BASE or used == layer or used in BELOW[layer]:
                continue
            wrong.append(f"{path.relative_to(root.parent.parent)}:{number}: {layer}/ includes decentrain/{used}/, "
                         f"which is not below it (it may use: {', '.join(sorted(BELOW[layer])) or 'std only'})")
    if wrong:
        print("\n".join(wrong))
        sys.exit(1)
    print(f"check_layers: {len(seen)} folders, every include points downwards")


if __name__ == "__main__":
    main()
