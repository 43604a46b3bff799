"""Options written before the command (`scheduler --token x delayed list`): moved after it.

argparse reads an option only in the parser that defines it, and the shared options
(`--url`, `--token`, `--json`, `--timeout` of the operator verbs; `--config`, `--data-dir` of
`run` and `migrate`) belong to each command's own parser, so before the command they were
refused (`invalid choice: 'x'`). `hoist` moves the leading ones to the end of the arguments,
where the command's parser reads them; an option the command does not take is then refused
by that command, naming the option.
"""

from __future__ import annotations

from collections.abc import Sequence

WITH_VALUE = frozenset({"--url", "--token", "--timeout", "--config", "--data-dir"})
FLAGS = frozenset({"--json"})


def hoist(argv: Sequence[str]) -> list[str]:
    """`argv` with the shared options that precede the command moved after everything else
    (before a `--`, if there is one); anything else is left where it is."""
    args = list(argv)
    moved: list[str] = []
    i = 0
    while i < len(args):
        name = args[i].split("=", 1)[0]
        if name in FLAGS or (name in WITH_VALUE and "=" in args[i]):
            moved.append(args.pop(i))
        elif name in WITH_VALUE and i + 1 < len(args):
            moved += [args.pop(i), args.pop(i)]
        else:
            break  # the command (or an option of the top-level parser, or a typo): stop here
    if not moved:
        return args
    end = args.index("--") if "--" in args else len(args)
    return args[:end] + moved + args[end:]
