"""mutmut over the decoding core (configured in pyproject.toml's [tool.mutmut]), less one class of mutants.

    python scripts/mutation.py run --max-children 2     # hours on 2 cores; then:
    python scripts/mutation_report.py --survivors

It is mutmut's own command line, with one change to its mutators: an argument that names a device (``device=...``,
or a value such as ``x.device``) is not replaced by None or dropped. On a machine with only a CPU every tensor is
already on the CPU, so each such mutant is equivalent here and would cost a full run of every test that reaches its
function to show it; the ``gpu``-marked tests are where a wrong device fails. Every other mutant mutmut makes is
kept.
"""

from __future__ import annotations

import sys

import libcst as cst
from mutmut.__main__ import cli
from mutmut.mutation import mutators


def names_a_device(arg: cst.Arg) -> bool:
    """``device=...``, ``x.device`` or ``device``."""
    if arg.keyword is not None and arg.keyword.value == "device":
        return True
    value = arg.value
    return (isinstance(value, cst.Attribute) and value.attr.value == "device") or (
        isinstance(value, cst.Name) and value.value == "device")


def arg_removal(node: cst.Call):
    """mutmut's ``operator_arg_removal``, except where the argument replaced or dropped names a device."""
    for mutated in mutators.operator_arg_removal(node):
        old, new = node.args, mutated.args
        if len(new) < len(old):  # one dropped: the first position where they differ
            i = next((i for i, (a, b) in enumerate(zip(old, new)) if a is not b), len(new))
        else:  # one replaced by None
            i = next(i for i, (a, b) in enumerate(zip(old, new)) if a is not b)
        if not names_a_device(old[i]):
            yield mutated


ops = mutators.mutation_operators  # the list mutmut's file mutation reads: changed in place
ops[ops.index((cst.Call, mutators.operator_arg_removal))] = (cst.Call, arg_removal)

if __name__ == "__main__":
    sys.argv[0] = "mutmut"
    cli()
