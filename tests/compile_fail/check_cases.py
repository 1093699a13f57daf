#!/usr/bin/env python3
"""Runs one compilation that holds several compile-fail cases (slot_members.cpp) and checks that
each case failed with its own sentence.

    check_cases.py --style gcc|clang --source FILE CASE=REGEX ... -- COMPILER ARGS...

A case is a value of the file's `leave_out` enum, instantiated through instantiate<case>(). Each
error is the case's whose `leave_out::CASE` the diagnostic names: g++ prints an error's
instantiation context before it, clang++ after it. Passes when the compilation fails, every case
has an error that REGEX matches (Python's re.search), no error is unattributed or `none`'s (the
positive control), and every case in the file has a sentence here."""
import re
import subprocess
import sys


def main(argv):
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1:]
    style = opts[opts.index("--style") + 1]
    source = opts[opts.index("--source") + 1]
    expected = dict(a.split("=", 1) for a in opts if "=" in a and not a.startswith("--"))
    cases = re.findall(r"instantiate<leave_out::(\w+)>\(\)", open(source).read())
    problems = [f"{c}: instantiated in {source} but given no sentence" for c in cases
                if c != "none" and c not in expected]
    problems += [f"{c}: given a sentence but not instantiated in {source}" for c in expected if c not in cases]

    run = subprocess.run(command, capture_output=True, text=True)
    lines = (run.stdout + run.stderr).splitlines()
    mention = re.compile(r"leave_out::(\w+)")
    errors = {}  # case -> its error lines
    for i, line in enumerate(lines):
        if " error: " not in line:
            continue
        case = None
        if style == "gcc":  # the context above the error, and the error itself
            for earlier in reversed(lines[: i + 1]):
                if m := mention.search(earlier):
                    case = m.group(1)
                    break
        else:  # the error, then the notes below it, up to the next error
            for later in lines[i:]:
                if later is not line and " error: " in later:
                    break
                if m := mention.search(later):
                    case = m.group(1)
                    break
        errors.setdefault(case, []).append(line)
    if run.returncode == 0:
        problems.append("the file compiled")
    for line in errors.get(None, []):
        problems.append(f"an error of no case: {line}")
    for line in errors.get("none", []):
        problems.append(f"the positive control (none) failed: {line}")
    for case, sentence in expected.items():
        mine = errors.get(case, [])
        if not any(re.search(sentence, line) for line in mine):
            problems.append(f"{case}: no error matches '{sentence}'; its errors: {mine or 'none'}")
        else:
            print(f"{case}: failed with its sentence")
    if problems:
        print("\n".join(problems), "\n\nThe compiler's output:\n" + "\n".join(lines), sep="")
        return 1
    print(f"{len(expected)} cases, each failing with its own sentence, and the positive control compiling")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
