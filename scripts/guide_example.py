#!/usr/bin/env python3
"""Writes the code block that follows `<!-- guide-example: NAME -->` in a Markdown file to OUT,
so the build compiles and the tests run the guide's examples as they are written. With --check,
compares the block with FILE instead (an example whose source is a file of its own, which the
guide prints) and fails, naming the first line that differs, unless the two are the same."""
import re
import sys


def block(guide: str, name: str):
    text = open(guide, encoding="utf-8").read()
    m = re.search(r"<!-- guide-example: " + re.escape(name) + r" -->\s*```cpp\n(.*?)\n```", text, re.S)
    return m.group(1) + "\n" if m else None


def check(guide: str, name: str, path: str) -> int:
    code = block(guide, name)
    if code is None:
        print(f"guide_example.py: no example '{name}' in {guide}", file=sys.stderr)
        return 1
    source = open(path, encoding="utf-8").read()
    if code == source:
        return 0
    a, b = code.splitlines(), source.splitlines()
    if a == b:
        print(f"guide_example.py: {guide}'s example '{name}' and {path} differ only in line endings or the "
              f"final newline (the file must end with exactly one)", file=sys.stderr)
        return 1
    line = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    print(f"guide_example.py: {guide}'s example '{name}' differs from {path} at line {line + 1}:\n"
          f"  guide: {a[line] if line < len(a) else '(ends)'}\n  file:  {b[line] if line < len(b) else '(ends)'}\n"
          f"copy {path} into the guide's block", file=sys.stderr)
    return 1


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--check":
        return check(*sys.argv[2:])
    if len(sys.argv) != 4:
        print("usage: guide_example.py GUIDE.md NAME OUT.cpp\n       guide_example.py --check GUIDE.md NAME FILE.cpp",
              file=sys.stderr)
        return 2
    guide, name, out = sys.argv[1:]
    code = block(guide, name)
    if code is None:
        print(f"guide_example.py: no example '{name}' in {guide}", file=sys.stderr)
        return 1
    try:
        if open(out, encoding="utf-8").read() == code:
            return 0  # unchanged: keep the timestamp, so nothing rebuilds
    except OSError:
        pass
    open(out, "w", encoding="utf-8").write(code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
