#!/usr/bin/env python3
"""Checks that no Catch2 test name would hang its own failure report.

Catch2 v2's console reporter indents a test name's wrapped lines to just after its first ": ";
where that falls past the 80-column console, the wrapping never ends and the report of a
failure grows until the disk is full. Every TEST_CASE name under tests/ whose
first ": " ends past column 70 is named with its file and line, and the script exits 1.
So is every name tests/serial_tests.cmake runs alone that no TEST_CASE has (CTest ignores a
property set on a test that does not exist: a renamed case would quietly run beside others).
Run with no arguments from anywhere; --root DIR checks another tree.
"""
import argparse
import pathlib
import re
import sys

LIMIT = 70
NAME = re.compile(r'TEST_CASE\(\s*"((?:[^"\\]|\\.)*)"')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    root = pathlib.Path(parser.parse_args().root)
    bad = []
    names = set()
    for path in sorted((root / "tests").rglob("*.cpp")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in NAME.finditer(line):
                names.add(m.group(1).replace('\\"', '"'))
                at = m.group(1).find(": ")
                if at >= 0 and at + 2 > LIMIT:
                    bad.append(f"{path.relative_to(root)}:{number}: the first ': ' ends at column {at + 2} "
                               f"(past {LIMIT}): Catch2 would wrap this name forever on a failure; say it with ', '")
    serial = root / "tests" / "serial_tests.cmake"
    if serial.exists():
        for name in re.findall(r'^\s*"test_\w+:([^"]*)"', serial.read_text(encoding="utf-8"), re.M):
            if name not in names:
                bad.append(f"tests/serial_tests.cmake: no TEST_CASE is named '{name}' (renamed? name it there too)")
    for b in bad:
        print(b)
    print(f"check_test_names: {len(bad)} test names that would hang a failure report or are not there" if bad
          else "check_test_names: every test name wraps")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
