"""The command line the plot scripts share: INPUT.json [MORE.json...] OUT.png [TITLE].

  inputs, out, title = plot_args.parse(sys.argv[1:], __doc__)

Exits with `usage` (the script's docstring) when the arguments do not have that shape.
"""
import sys


def parse(args, usage):
    args = list(args)
    title = None
    if len(args) >= 3 and not args[-1].endswith(".png"):
        title = args.pop()
    if len(args) < 2 or not args[-1].endswith(".png"):
        sys.exit(usage)
    out = args.pop()
    return args, out, title
