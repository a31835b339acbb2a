"""submitit's payload of a sweep's job, checked without unpickling it.

submitit pickles the call a job makes (`SWEEP/slurm/submitit/JOB/JOB_submitted.pkl`: at submission, and again
from its signal handler at each requeue) and unpickles it on the node, and unpickling runs whatever the pickle
names. So before submitit loads it, the job reads it as data here: `pickletools.genops` walks its opcodes and
`_evaluate` builds what they describe out of plain values, importing and calling nothing. The two globals a
sweep's payload holds (submitit's `DelayedSubmission`, rrtrain's `RunJob`) are kept as their names; any other
global (a function cloudpickle pickled by value, `os.system`, ...) or any opcode that calls something is
refused, and the result must be exactly the call submitted (`problem`). Standard library only: it runs from its
text in the job script (`launchers.sweep.seal.inline_source`), before anything of the sweep directory.
"""

from __future__ import annotations

import pickletools
from typing import Any, Optional

#: the two globals a sweep job's submitit payload names: submitit's call, and what it calls (a prep's array task
#: calls its own ArrayTask class instead: `problem`'s `callee`)
SUBMITIT_CALL = ("submitit.core.utils", "DelayedSubmission")
RUN_JOB = ("launchers.executors.entry", "RunJob")
#: every attribute of submitit's call (submitit 1.5): one more or less is not the call submitted
CALL_FIELDS = {"function", "args", "kwargs", "_result", "_done", "_timeout_min", "_timeout_countdown"}
#: the largest payload read (a sweep job's is about 250 bytes plus its sweep directory's path): the walk is
#: linear, but a megabyte of opcodes takes seconds
MAX_BYTES = 64 << 10
#: opcodes that build plain data: their argument is the value pushed
_VALUES = {"BININT", "BININT1", "BININT2", "INT", "LONG", "LONG1", "LONG4", "BINFLOAT", "FLOAT", "UNICODE",
           "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8",
           "STRING", "BINSTRING", "SHORT_BINSTRING", "BYTEARRAY8"}
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_EMPTY = {"EMPTY_TUPLE": tuple, "EMPTY_LIST": list, "EMPTY_DICT": dict, "EMPTY_SET": set}
#: what a dict key or a set member may be: hashing a value nested a million deep would exhaust the C stack
_KEYS = (str, bytes, int, float, bool, type(None))


class _Refused(Exception):
    """Why a payload is not the call submitted."""


class _Object:
    """An instance the payload builds (NEWOBJ of an allowed global, then BUILD), kept as data."""

    def __init__(self, cls: tuple[str, str]) -> None:
        self.cls, self.state = cls, {}


def _evaluate(data: bytes, callee: tuple[str, str] = RUN_JOB) -> Any:
    """The object `data` pickles, built from its opcodes (`pickletools.genops`) as plain data: an allowed global
    (submitit's call, `callee`) is its (module, name), an instance an `_Object`. Nothing is imported or called; any
    opcode that would call something (REDUCE, INST, OBJ, NEWOBJ_EX, EXT*, PERSID) or any other global is
    refused."""
    stack: list[Any] = []
    marks: list[int] = []  # where each open MARK is on the stack (pickle's own metastack): no scan for it
    memo: dict[int, Any] = {}

    def to_mark() -> list[Any]:
        i = marks.pop()
        items = stack[i:]
        del stack[i:]
        return items

    def keys(*values: Any) -> None:
        if any(type(v) not in _KEYS for v in values):
            raise _Refused("it holds a key that is not a plain value")

    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in _VALUES:
            stack.append(arg)
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name])
        elif name in _EMPTY:
            stack.append(_EMPTY[name]())
        elif name in ("PROTO", "FRAME"):
            continue
        elif name == "STOP":
            return stack.pop()
        elif name == "MARK":
            marks.append(len(stack))
        elif name in ("TUPLE", "LIST"):
            stack.append((tuple if name == "TUPLE" else list)(to_mark()))
        elif name == "FROZENSET":
            items = to_mark()
            keys(*items)
            stack.append(frozenset(items))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = stack[-n:]
            if len(items) != n:
                raise _Refused("it is malformed")
            del stack[-n:]
            stack.append(tuple(items))
        elif name == "DICT":
            items = to_mark()
            keys(*items[::2])
            stack.append(dict(zip(items[::2], items[1::2])))
        elif name == "APPEND":
            value = stack.pop()
            stack[-1].append(value)
        elif name == "APPENDS":
            items = to_mark()
            stack[-1].extend(items)
        elif name == "SETITEM":
            value, key = stack.pop(), stack.pop()
            keys(key)
            stack[-1][key] = value
        elif name == "SETITEMS":
            items = to_mark()
            keys(*items[::2])
            stack[-1].update(zip(items[::2], items[1::2]))
        elif name == "ADDITEMS":
            items = to_mark()
            keys(*items)
            stack[-1].update(items)
        elif name == "POP":
            stack.pop()
        elif name == "POP_MARK":
            to_mark()
        elif name == "DUP":
            stack.append(stack[-1])
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo[arg])
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            module, _, attr = arg.partition(" ") if name == "GLOBAL" else (stack.pop(-2), None, stack.pop())
            if (module, attr) not in (SUBMITIT_CALL, callee):
                raise _Refused(f"it names {module}.{attr}" if isinstance(module, str) and isinstance(attr, str)
                               else "it names a global it computes")
            stack.append((module, attr))
        elif name == "NEWOBJ":
            args, cls = stack.pop(), stack.pop()
            if cls not in (SUBMITIT_CALL, callee) or args != ():
                raise _Refused("it builds an object of another kind")
            stack.append(_Object(cls))
        elif name == "BUILD":
            state = stack.pop()
            if not isinstance(stack[-1], _Object) or not isinstance(state, dict):
                raise _Refused("it sets the state of something other than the call")
            stack[-1].state.update(state)
        else:
            raise _Refused(f"it holds a {name} opcode")
    raise _Refused("it has no end")


def problem(data: bytes, sweep_dir: str, run_id: str) -> Optional[str]:
    """Why `data`, a submitit payload, is not the call a sweep job submits (submitit's `DelayedSubmission` of
    `RunJob(sweep_dir)` with `run_id` as its one argument, not yet done), or None."""
    return call_problem(data, RUN_JOB, {"sweep_dir": sweep_dir}, run_id, "this sweep's run", "another run than this task's")


def call_problem(data: bytes, callee: tuple[str, str], state: dict[str, Any], argument: Any, what: str = "this task",
                 other: str = "another task than this one") -> Optional[str]:
    """Why `data` is not submitit's `DelayedSubmission` of an instance of `callee` whose attributes are exactly
    `state`, called with `argument` alone and not yet done, or None. `what`, `other`: how a refusal names the
    callee and a wrong argument."""
    try:
        call = _evaluate(data, callee)
    except _Refused as why:
        return str(why)
    except (ValueError, TypeError, IndexError, KeyError, AttributeError, RecursionError, MemoryError):
        return "it is malformed"  # genops' own errors, or an opcode on the wrong kind of value
    if not isinstance(call, _Object) or call.cls != SUBMITIT_CALL or set(call.state) != CALL_FIELDS:
        return "it is not submitit's call"
    job, fields = call.state["function"], call.state
    if not isinstance(job, _Object) or job.cls != callee or job.state != state:
        return f"it calls something other than {what}"
    if fields["args"] != (argument,) or type(fields["args"][0]) is not type(argument) or fields["kwargs"] != {}:
        return f"it runs {other}"
    if fields["_done"] is not False or fields["_result"] is not None:
        return "it holds a result instead of running the run"
    if not all(type(fields[k]) is int for k in ("_timeout_min", "_timeout_countdown")):
        return "it is not submitit's call"
    return None
