#!/usr/bin/env python3
"""Writes the code block that follows `<!-- guide-example: NAME -->` in a Markdown file to OUT,
so the build compiles and the tests run the guide's examples as they are written."""
import re
import sys


def main() -> int:
    if len(sys.argv) != 4:
        print("usage: guide_example.py GUIDE.md NAME OUT.cpp", file=sys.stderr)
        return 2
    guide, name, out = sys.argv[1:]
    text = open(guide, encoding="utf-8").read()
    m = re.search(r"<!-- guide-example: " + re.escape(name) + r" -->\s*```cpp\n(.*?)\n```", text, re.S)
    if not m:
        print(f"guide_example.py: no example '{name}' in {guide}", file=sys.stderr)
        return 1
    code = m.group(1) + "\n"
    try:
        if open(out, encoding="utf-8").read() == code:
            return 0  # unchanged: keep the timestamp, so nothing rebuilds
    except OSError:
        pass
    open(out, "w", encoding="utf-8").write(code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
