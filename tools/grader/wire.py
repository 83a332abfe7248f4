"""The boundary between a student's process and the grading harness: values by value, objects by handle.

Both sides run the same ``Peer``. A message is a JSON header plus raw tensor bytes; nothing on
the wire can run code when decoded (no pickle): tensors are rebuilt from bytes with a dtype from
a fixed list and a checked shape, everything else is JSON. Objects that are not plain values
(a student's class, a harness callback, a micrograd ``Value``) stay where they live and cross
as a numbered handle; the other side gets a ``Remote`` whose calls and attribute reads travel
back. A peer that holds handles of the other side can only call them and read or write their
attributes whose names do not start with ``__`` (so no ``__globals__``, ``__class__``, ...).

While one side waits for the answer to its request it serves the other side's requests (a
student's function calling a harness callback, the harness reading an attribute of a
student's object), so calls can nest both ways.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import struct
import time
from typing import Any, BinaryIO, Callable

import torch

MAX_HEADER = 64 << 20  # bytes of JSON in one message
# tensor bytes in one message: the largest a published solution sends or gets back is 24 MiB (lab 8's
# memory class); a return of 256 MiB (red team: expanded zeros) took 31 s of a grading to cross
MAX_BLOBS = 64 << 20
MAX_DEPTH = 64  # nesting of lists, tuples and dicts
DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


# what the worker's guard reports when a by-hand exercise's call starts a thread (a word of the protocol:
# the harness repeats it to the student, as it repeats the names a by-hand list holds)
THREAD = "a thread"
REPLIED = object()  # a handler's result: the reply has been sent already (by a forked child)


# allocated at import, before any memory cap: a message cut short by MemoryError is read to its end into it
_DRAIN = bytearray(1 << 16)


class WireError(Exception):
    """The other side sent something that is not a well-formed message."""


class RemoteError(Exception):
    """The other side raised while serving a request: ``kind`` is its exception's type name."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind, self.message = kind, message


class InertHook:
    """A hook the other side's code left on a module: counted (`not m._forward_hooks`), sent back as
    itself, but never run here, where it could change what a reference computation sees."""

    def __init__(self, remote: "Remote"):
        self.remote = remote

    def __call__(self, *args, **kwargs):
        raise RuntimeError("a hook left on this module by the submission's code")


def _inert(hook):
    return InertHook(hook) if isinstance(hook, Remote) else hook


class Blobs(list):
    """A message's tensor bytes, plus its identity tables (a tensor met twice is one tensor on arrival)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.sent: dict[int, int] = {}  # id(tensor) -> its number in this message (encoding)
        self.got: dict[int, torch.Tensor] = {}  # number -> tensor (decoding)
        self.keep: list = []  # objects whose id() is in `sent` stay alive meanwhile


class Remote:
    """A handle on an object that lives in the other process."""

    __slots__ = ("_peer", "_id", "_kind", "__weakref__")

    def __init__(self, peer: "Peer", ident: int, kind: str):
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_id", ident)
        object.__setattr__(self, "_kind", kind)

    def __call__(self, *args, **kwargs):
        return self._peer.call(self, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._peer.request({"op": "getattr", "ref": self._id, "name": name})

    def __setattr__(self, name: str, value) -> None:
        self._peer.request({"op": "setattr", "ref": self._id, "name": name}, value)

    def __repr__(self) -> str:
        return f"<remote {self._kind}>"

    def _op(self, name, *args):
        return self._peer.request({"op": "dunder", "ref": self._id, "name": name}, args, True)


def _dunder(name):
    def method(self, *args):
        result = self._op(name, *args)
        if name in ARITHMETIC and not isinstance(result, Remote):
            # arithmetic on a student's object gives a student's object: a `__sub__` that returns
            # 0.0 would pass `abs(x.data - expected) < tol` without computing anything
            raise TypeError(f"{self._kind}.{name} returned a plain value across the boundary")
        return result

    method.__name__ = name
    return method


def _not_a_truth_value(self):
    raise TypeError(f"a {self._kind} of the other side has no truth value here")


# operators a test may apply to a student's object (a micrograd Value: `power(y, 0.5) + power(y, -1)`);
# no comparisons and no truth value: `assert student_object < tol` must not be the student's to answer
ARITHMETIC = (
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__truediv__",
    "__rtruediv__",
    "__pow__",
    "__rpow__",
    "__neg__",
    "__matmul__",
    "__rmatmul__",
)
DUNDERS = ARITHMETIC + ("__float__", "__int__", "__len__")
for _name in DUNDERS:
    setattr(Remote, _name, _dunder(_name))
Remote.__bool__ = _not_a_truth_value


class Peer:
    """One end of the boundary: encodes, decodes, sends requests and serves the other end's."""

    def __init__(
        self,
        rfile: BinaryIO,
        wfile: BinaryIO,
        *,
        serve_dunder: bool = False,
        on_call: Callable | None = None,
        on_getattr: Callable | None = None,
    ):
        self.rfile, self.wfile = rfile, wfile
        self.objects: dict[int, Any] = {}  # handles this side gave out
        self.ids: dict[int, int] = {}  # id(obj) -> handle
        self.remotes: dict[int, Remote] = {}  # the other side's handles, one Remote each (keeps `is`)
        self.serve_dunder = serve_dunder
        self.send_code = False  # the harness sends its tests' functions as source (see portable)
        self.accept_code = False  # only the worker compiles what it receives; the harness never does
        self.mutables: list[dict] = []  # harness: per portable function, its list/dict globals
        self.envs: dict = {}  # worker: per portable function, its namespace
        self.sent_modules: dict[int, torch.nn.Module] = {}  # token -> a module this side sent by value
        self.module_token: dict[int, tuple] = {}  # id(module received by value) -> (the sender's token, it)
        self.received_modules: list = []  # (token, module) received by value, echoed back after a call
        self.on_call = on_call or (lambda fn, args, kwargs, opts: fn(*args, **kwargs))
        # what the other side gets for obj.name (the worker: a Function's apply that checks its grad_fn)
        self.on_getattr = on_getattr or (lambda obj, name: getattr(obj, name))
        self.handlers: dict[str, Callable] = {}

    # ------------------------------------------------------------------ values

    def encode(self, obj, blobs: list, depth: int = 0):
        """A JSON-able tree for ``obj``; tensor bytes go to ``blobs``."""
        if depth > MAX_DEPTH:
            raise WireError("value nested too deeply")
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if obj is Ellipsis:  # a stub's `...`
            return {"ellipsis": True}
        if isinstance(obj, int):
            return obj if abs(obj) < 2**62 else {"bigint": str(obj)}
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else {"float": repr(obj)}
        if (
            isinstance(obj, torch.Tensor)
            and type(obj) in (torch.Tensor, torch.nn.Parameter)
            and obj.layout == torch.strided
            and obj.device.type == "meta"
        ):  # made where a case's device="meta" said: a shape and a dtype, no values
            dtype = str(obj.dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                raise WireError(f"tensor dtype {dtype} cannot cross")
            return {"meta": list(obj.shape), "dtype": dtype}
        if (
            isinstance(obj, torch.Tensor)
            and type(obj) in (torch.Tensor, torch.nn.Parameter)
            and obj.layout == torch.strided
        ):
            if isinstance(blobs, Blobs):
                if id(obj) in blobs.sent:
                    return {"same": blobs.sent[id(obj)]}
                blobs.sent[id(obj)] = len(blobs.sent)
                blobs.keep.append(obj)
            t = obj.detach().to("cpu")
            order = _memory_order(t)  # a transposed view crosses as one (lab 2: X may be non-contiguous)
            t = (t.permute(*order) if order else t).contiguous()
            dtype = str(t.dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                raise WireError(f"tensor dtype {dtype} cannot cross")
            # the tensor's own bytes, not a copy: a capped call (worker.capped) may send 8 MiB within a
            # 2 MiB budget; the array keeps the tensor alive until the message is written
            blobs.append(memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else b"")
            node = {
                "tensor": len(blobs) - 1,
                "dtype": dtype,
                "shape": list(t.shape),
                "grad": bool(obj.requires_grad),
                "param": isinstance(obj, torch.nn.Parameter),
            }
            if order:
                node["order"] = order
            if obj.is_leaf and obj.grad is not None:  # a leaf's .grad travels with it (clipping edits it)
                node["dot_grad"] = self.encode(obj.grad, blobs, depth + 1)
            if isinstance(blobs, Blobs):
                node["n"] = blobs.sent[id(obj)]
            return node
        if isinstance(obj, torch.dtype):
            return {"dtype_of": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.device):  # causal_mask(N, device=Q.device), called back across
            return {"device": str(obj)}
        if isinstance(obj, torch.Size):
            return {"size": [int(s) for s in obj]}
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            return {
                "list" if isinstance(obj, list) else "tuple": [self.encode(x, blobs, depth + 1) for x in obj]
            }
        if type(obj) is dict and all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in obj):
            return {"dict": [[k, self.encode(v, blobs, depth + 1)] for k, v in obj.items()]}
        if isinstance(obj, Remote) and obj._peer is self:
            return {"yours": obj._id}
        if isinstance(obj, InertHook) and obj.remote._peer is self:
            return {"yours": obj.remote._id}
        if isinstance(obj, torch.nn.Module) and self.module_token.get(id(obj), (0, None))[1] is obj:
            return {"yours_module": self.module_token[id(obj)][0]}
        if isinstance(obj, torch.nn.Module) and _importable(type(obj)):
            return self.encode_module(obj, blobs, depth)
        if isinstance(obj, torch.optim.Optimizer) and _importable(type(obj), ("torch.optim.",)):
            return self.encode_optimizer(obj, blobs, depth)
        portable = self.portable(obj, blobs, depth) if self.send_code else None
        if portable is not None:
            return portable
        if id(obj) not in self.ids:
            self.ids[id(obj)] = len(self.objects) + 1
            self.objects[self.ids[id(obj)]] = obj
        return {"handle": self.ids[id(obj)], "kind": type(obj).__name__}

    def decode(self, node, blobs: list[bytes], depth: int = 0):
        """The value for a tree made by the other side's ``encode``; never runs code."""
        if depth > MAX_DEPTH:
            raise WireError("value nested too deeply")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or len(node) == 0:
            raise WireError(f"bad value {str(node)[:40]}")
        if "meta" in node:
            dtype, shape = DTYPES.get(node.get("dtype")), node["meta"]
            if (
                dtype is None
                or not isinstance(shape, list)
                or not all(isinstance(s, int) and 0 <= s < 1 << 40 for s in shape)
            ):
                raise WireError("bad tensor header")
            return torch.empty(shape, dtype=dtype, device="meta")
        if "tensor" in node:
            dtype = DTYPES.get(node.get("dtype"))
            shape = node.get("shape")
            if (
                dtype is None
                or not isinstance(shape, list)
                or not all(isinstance(s, int) and s >= 0 for s in shape)
            ):
                raise WireError("bad tensor header")
            raw = blobs[node["tensor"]]
            n = math.prod(shape)
            if len(raw) != n * torch.empty((), dtype=dtype).element_size():
                raise WireError("tensor bytes do not match its shape")
            t = (torch.frombuffer(bytearray(raw), dtype=dtype) if n else torch.empty(0, dtype=dtype)).reshape(
                shape
            )
            order = node.get("order")
            if order is not None:  # the dims in memory order: permute back to the sender's view
                if not isinstance(order, list) or sorted(order) != list(range(len(shape))):
                    raise WireError("bad tensor order")
                t = t.permute(*[order.index(d) for d in range(len(order))])
            if node.get("param"):
                t = torch.nn.Parameter(t, requires_grad=bool(node.get("grad")))
            elif node.get("grad") and (t.is_floating_point() or t.is_complex()):
                t.requires_grad_()
            if "dot_grad" in node:
                g = self.decode(node["dot_grad"], blobs, depth + 1)
                if not isinstance(g, torch.Tensor) or g.shape != t.shape or g.dtype != t.dtype:
                    raise WireError("a .grad that does not fit its tensor")
                t.grad = g
            if isinstance(blobs, Blobs) and "n" in node:
                blobs.got[int(node["n"])] = t
            return t
        if "same" in node:
            if not isinstance(blobs, Blobs) or int(node["same"]) not in blobs.got:
                raise WireError("bad tensor reference")
            return blobs.got[int(node["same"])]
        if "float" in node:
            return float(node["float"]) if node["float"] in ("nan", "inf", "-inf") else _bad(node)
        if "ellipsis" in node:
            return Ellipsis
        if "bigint" in node:
            return int(node["bigint"])
        if "dtype_of" in node:
            return DTYPES[node["dtype_of"]] if node["dtype_of"] in DTYPES else _bad(node)
        if "device" in node:
            name = node["device"]
            return (
                torch.device(name)
                if isinstance(name, str) and re.fullmatch(r"(cpu|cuda|mps)(:\d{1,2})?", name)
                else _bad(node)
            )
        if "size" in node:
            return torch.Size([int(s) for s in node["size"]])
        if "list" in node:
            return [self.decode(x, blobs, depth + 1) for x in node["list"]]
        if "tuple" in node:
            return tuple(self.decode(x, blobs, depth + 1) for x in node["tuple"])
        if "dict" in node:
            return {
                (k if isinstance(k, (str, int)) else _bad(node)): self.decode(v, blobs, depth + 1)
                for k, v in node["dict"]
            }
        if "portable" in node:
            if not self.accept_code:
                raise WireError("code is not accepted from this side")
            return self.compile_portable(node, blobs, depth)
        if "module" in node:
            if not self.accept_code:
                raise WireError("code is not accepted from this side")
            import importlib

            return importlib.import_module(str(node["module"]))
        if "nn" in node:
            return self.decode_module(node, blobs, depth)
        if "optim" in node:
            return self.decode_optimizer(node, blobs, depth)
        if "yours_module" in node:
            if node["yours_module"] not in self.sent_modules:
                raise WireError("unknown module")
            return self.sent_modules[node["yours_module"]]
        if "yours" in node:
            if node["yours"] not in self.objects:
                raise WireError("unknown handle")
            return self.objects[node["yours"]]
        if "handle" in node:
            ident = int(node["handle"])
            if ident not in self.remotes:
                self.remotes[ident] = Remote(self, ident, str(node.get("kind", "object"))[:60])
            return self.remotes[ident]
        raise WireError(f"bad value {str(node)[:40]}")

    # --------------------------------------------------------- modules, optimizers
    # An nn.Module of torch's or the course's classes (a test's nn.Linear, helpers.gradflow's
    # DeepMLP) crosses by value: its class by name, its parameters, buffers, submodules and plain
    # attributes; hooks cross as handles. The receiver sends its state back after the call
    # (``module_echo``), so the sender's module ends as the student's code left it: same
    # Parameter objects when they were changed in place, new ones when they were replaced.

    def encode_module(self, m, blobs, depth):
        token = len(self.sent_modules) + 1
        self.sent_modules[token] = m
        return {"nn": _path(type(m)), "token": token, "state": self._module_state(m, blobs, depth)}

    def _module_state(self, m, blobs, depth):
        state = {
            "training": m.training,
            "_parameters": self.encode(dict(m._parameters), blobs, depth + 1),
            "_buffers": self.encode(dict(m._buffers), blobs, depth + 1),
            "_modules": {
                k: (None if v is None else self.encode(v, blobs, depth + 1)) for k, v in m._modules.items()
            },
            "hooks": {k: self.encode(list(getattr(m, k).values()), blobs, depth + 1) for k in _HOOKS},
        }
        plain = {}
        for k, v in vars(m).items():
            if k.startswith("_") or k == "training":
                continue
            try:
                plain[k] = self.encode(v, Blobs(), depth + 1) if _plain(v) else None
            except WireError:
                continue
            if plain[k] is None and v is not None:
                del plain[k]
        state["plain"] = plain
        return state

    def decode_module(self, node, blobs, depth):
        import collections

        cls = _resolve(str(node["nn"]), torch.nn.Module)
        m = cls.__new__(cls)
        torch.nn.Module.__init__(m)
        st = node["state"]
        m.training = bool(st["training"])
        for key in ("_parameters", "_buffers"):
            getattr(m, key).update(self.decode(st[key], blobs, depth + 1))
        for k, v in st["plain"].items():
            if isinstance(k, str) and k.isidentifier() and not k.startswith("_"):
                object.__setattr__(m, k, self.decode(v, Blobs(), depth + 1))
        for k in _HOOKS:
            hooks = self.decode(st["hooks"].get(k, {"list": []}), blobs, depth + 1)
            setattr(m, k, collections.OrderedDict(enumerate(_inert(h) for h in hooks)))
        m._modules.update(
            {k: (None if v is None else self.decode(v, blobs, depth + 1)) for k, v in st["_modules"].items()}
        )
        token = int(node["token"])
        self.module_token[id(m)] = (token, m)  # the module itself too: an id alone could be reused
        if not any(t == token for t, *_ in self.received_modules):
            first = {  # each tensor as it arrived, and its version counter then
                (path, key, name): (t, None if t is None else t._version)
                for path, sub in m.named_modules()
                for key in ("_parameters", "_buffers")
                for name, t in getattr(sub, key).items()
            }
            self.received_modules.append((token, m, first))
        return m

    def module_echo(self) -> list:
        """[token, rows] for each module received by value: what the student's code left in it.

        One row per submodule: its path, training flag, hooks (as handles), and per parameter
        or buffer its value, whether it is still the tensor object that arrived, and whether its
        version counter moved (a write through ``.data`` changes the values and not the counter).
        """
        out = []
        for token, m, first in self.received_modules:
            rows = []
            for path, sub in m.named_modules(remove_duplicate=False):
                slots = {}
                for key in ("_parameters", "_buffers"):
                    slots[key] = {}
                    for name, t in getattr(sub, key).items():
                        was, version = first.get((path, key, name), (None, None))
                        same = t is not None and was is t
                        slots[key][name] = [t, same, not same or t._version != version]
                rows.append(
                    {
                        "path": path,
                        "training": sub.training,
                        **slots,
                        "hooks": {k: list(getattr(sub, k).values()) for k in _HOOKS},
                    }
                )
            out.append([token, rows])
        self.received_modules = []
        return out

    def apply_echo(self, echo) -> None:
        """Make each module this side sent what the other side's copy became (in place where it was changed in place)."""
        import collections

        for token, rows in echo:
            m = self.sent_modules.get(int(token))
            if m is None:
                continue
            subs = dict(m.named_modules(remove_duplicate=False))
            for row in rows:
                sub = subs.get(row["path"])
                if sub is None:
                    continue
                sub.training = bool(row["training"])
                for key in ("_parameters", "_buffers"):
                    slots = getattr(sub, key)
                    for name, entry in row[key].items():
                        t, same, moved = (list(entry) + [True])[:3]
                        cur = slots.get(name)
                        if (
                            same
                            and isinstance(cur, torch.Tensor)
                            and isinstance(t, torch.Tensor)
                            and cur.shape == t.shape
                        ):
                            with torch.no_grad():
                                # as it was changed there: in place (its counter moves), or through .data
                                # (values only), so a check of the version counter here sees what it would there
                                (cur if moved else cur.data).copy_(t)
                            cur.requires_grad_(t.requires_grad)
                            cur.grad = t.grad
                        else:
                            slots[name] = t
                for k in _HOOKS:
                    setattr(
                        sub, k, collections.OrderedDict(enumerate(_inert(h) for h in row["hooks"].get(k, [])))
                    )

    def encode_optimizer(self, opt, blobs, depth):
        params = [p for g in opt.param_groups for p in g["params"]]
        index = {id(p): i for i, p in enumerate(params)}  # by identity: == on tensors compares values
        groups = [
            {k: (v if k != "params" else [index[id(p)] for p in v]) for k, v in g.items()}
            for g in opt.param_groups
        ]
        state = [[index[id(p)], s] for p, s in opt.state.items() if id(p) in index]
        return {
            "optim": _path(type(opt)),
            "params": self.encode(params, blobs, depth + 1),
            "groups": self.encode(groups, blobs, depth + 1),
            "defaults": self.encode(dict(opt.defaults), blobs, depth + 1),
            "state": self.encode(state, blobs, depth + 1),
        }

    def decode_optimizer(self, node, blobs, depth):
        cls = _resolve(str(node["optim"]), torch.optim.Optimizer, ("torch.optim.",))
        params = self.decode(node["params"], blobs, depth + 1)
        groups = self.decode(node["groups"], blobs, depth + 1)
        for g in groups:
            g["params"] = [params[i] for i in g["params"]]
        import inspect

        accepted = inspect.signature(
            cls.__init__
        ).parameters  # defaults may hold keys the constructor sets itself
        defaults = {k: v for k, v in self.decode(node["defaults"], blobs, depth + 1).items() if k in accepted}
        opt = cls(groups, **defaults)
        for i, s in self.decode(node["state"], blobs, depth + 1):
            opt.state[params[i]] = s
        return opt

    # ------------------------------------------------------- portable functions
    # A function a hidden test defines (`lambda t: (t * t).sum()`, `def _blk(x, W): ...`) and hands
    # to a student's function must run beside the student's autograd (a checkpoint re-runs it, a
    # saved-bytes counter watches it). It crosses as its source text plus the values of the names
    # it reads; the worker compiles it. Only harness -> worker: the harness never compiles code.

    def portable(self, obj, blobs, depth):
        """A {"portable": ...} node for a test-defined function, else None."""
        import types

        src = getattr(obj, "__portable_source__", None)
        if src is None or not isinstance(obj, types.FunctionType):
            if isinstance(obj, types.ModuleType):
                return {"module": obj.__name__}
            return None
        env, mutable = {}, {}
        for name in sorted(_names(obj.__code__)):
            if name in obj.__code__.co_freevars:
                value = obj.__closure__[obj.__code__.co_freevars.index(name)].cell_contents
            elif name in obj.__globals__:
                value = obj.__globals__[name]
            else:
                continue  # a builtin
            if isinstance(value, types.ModuleType):
                env[name] = {"module": value.__name__}
            elif (
                isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type))
                and not hasattr(value, "__portable_source__")
                and getattr(value, "__module__", None)
                and "." not in getattr(value, "__qualname__", ".")
            ):
                env[name] = {"import": value.__module__, "name": value.__qualname__}
            else:
                env[name] = self.encode(value, blobs, depth + 1)
                if type(value) in (list, dict):
                    mutable[name] = value
                    home = getattr(obj, "__module__", "") or ""
                    if home.startswith("helpers.") and obj.__globals__.get(name) is value:
                        # a course module's own list (helpers.labcontract.BLOCK_LOG): the worker binds
                        # its module's list, so a probe run there (worker.capped) reads what it logs
                        env[name] = {"global_of": home, "value": env[name]}
        self.mutables.append(mutable)  # what the function appends to there is appended to here too
        return {"portable": src, "name": obj.__code__.co_name, "env": env, "pid": len(self.mutables) - 1}

    def compile_portable(self, node, blobs, depth):
        import builtins
        import importlib

        ns = {"__builtins__": builtins}
        for name, v in dict(node.get("env", {})).items():
            if isinstance(v, dict) and "import" in v:
                ns[name] = getattr(importlib.import_module(str(v["import"])), str(v["name"]))
            elif isinstance(v, dict) and "global_of" in v and str(v["global_of"]).startswith("helpers."):
                value = self.decode(v["value"], blobs, depth + 1)
                home = getattr(importlib.import_module(str(v["global_of"])), name, None)
                if type(home) is type(value) and type(value) in (list, dict):
                    home.clear()
                    (home.extend if isinstance(home, list) else home.update)(value)
                    value = home
                ns[name] = value
            else:
                ns[name] = self.decode(v, blobs, depth + 1)
        src = str(node["portable"])
        self.envs[int(node.get("pid", -1))] = (ns, [k for k, v in ns.items() if type(v) in (list, dict)])
        if node.get("name") == "<lambda>":
            return eval(compile(src, "<hidden test function>", "eval"), ns)
        exec(compile(src, "<hidden test function>", "exec"), ns)
        return ns[str(node["name"])]

    def mutated(self) -> list:
        """[pid, name, value] for every list or dict a portable function's namespace holds (sent back)."""
        return [[pid, k, ns[k]] for pid, (ns, names) in sorted(self.envs.items()) for k in names]

    def apply_mutated(self, rows) -> None:
        """Make the harness's lists and dicts what the worker's copies became."""
        for pid, name, value in rows:
            obj = self.mutables[pid].get(name) if 0 <= pid < len(self.mutables) else None
            if isinstance(obj, list) and isinstance(value, list):
                obj[:] = value
            elif isinstance(obj, dict) and isinstance(value, dict):
                obj.clear()
                obj.update(value)

    # ---------------------------------------------------------------- messages

    def send(self, header: dict, value=None, has_value: bool = False) -> None:
        blobs = Blobs()
        if has_value:
            header = dict(header, value=self.encode(value, blobs))
        total = sum(len(b) for b in blobs)
        if total > MAX_BLOBS:  # refused before a byte is written: the reply is an error, the stream in step
            raise WireError(
                f"a value of {total >> 20} MiB cannot cross (at most {MAX_BLOBS >> 20} MiB a message)"
            )
        head = json.dumps(header, allow_nan=False).encode()
        self.wfile.write(struct.pack("<QI", len(head), len(blobs)) + head)
        for b in blobs:
            self.wfile.write(struct.pack("<Q", len(b)))
            self.wfile.write(b)
        self.wfile.flush()

    def receive(self) -> tuple[dict, list[bytes]]:
        n_head, n_blobs = struct.unpack("<QI", self._read(12))
        if n_head > MAX_HEADER or n_blobs > 1 << 20:
            raise WireError("message too large")
        header = json.loads(self._read(n_head))
        blobs, total = Blobs(), 0
        for i in range(n_blobs):
            (n,) = struct.unpack("<Q", self._read(8))
            total += n
            if total > MAX_BLOBS:
                raise WireError("message too large")
            try:
                blobs.append(self._read(n))
            except MemoryError:  # a call under a memory cap (worker.capped): the stream stays in step
                for _ in range(n_blobs - i - 1):
                    self._drain(struct.unpack("<Q", self._read(8))[0])
                raise
        if not isinstance(header, dict):
            raise WireError("bad header")
        return header, blobs

    deadline: float | None = None  # time.monotonic() after which a read raises TimeoutError

    def _read(self, n: int) -> bytes:
        chunks, fd = [], self.rfile.fileno()
        while n:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError("no answer before the time limit")
            try:
                data = os.read(fd, min(n, 1 << 20))
            except MemoryError:
                self._drain(n)  # the rest of this part, read into memory held since import
                raise
            if not data:
                raise EOFError("the other side closed the connection")
            chunks.append(data)
            n -= len(data)
        return b"".join(chunks)

    def _drain(self, n: int) -> None:
        """Read and drop n bytes without allocating: what is left of a message no memory was left for."""
        fd = self.rfile.fileno()
        while n:
            got = os.readv(fd, [memoryview(_DRAIN)[: min(n, len(_DRAIN))]])
            if not got:
                raise EOFError("the other side closed the connection")
            n -= got

    # ---------------------------------------------------------------- requests

    def request(self, header: dict, value=None, has_value: bool | None = None):
        """Send a request and serve the other side until its reply comes; return the reply's value."""
        self.send(
            dict(header, kind="request"), value, has_value if has_value is not None else value is not None
        )
        while True:
            msg, blobs = self.receive()
            if msg.get("kind") == "reply":
                if "error" in msg:
                    raise RemoteError(str(msg["error"])[:80], str(msg.get("message", ""))[:300])
                return self.decode(msg.get("value"), blobs)
            if msg.get("kind") != "request":
                raise WireError("expected a request or a reply")
            self.serve(msg, blobs)

    def call(self, fn: Remote, args, kwargs, **opts):
        return self.request({"op": "call", "ref": fn._id, "opts": opts}, (tuple(args), dict(kwargs)), True)

    def serve(self, msg: dict, blobs: list[bytes]) -> None:
        """Answer one request of the other side (an exception becomes an error reply)."""
        try:
            value = self.decode(msg["value"], blobs) if "value" in msg else None
            op = msg.get("op")
            if op in self.handlers:
                result = self.handlers[op](msg, value)
            else:
                obj = self.objects.get(msg.get("ref"))
                if obj is None:
                    raise WireError("unknown handle")
                name = msg.get("name")
                if (
                    op in ("getattr", "setattr", "dunder")
                    and name not in DUNDERS
                    and (not isinstance(name, str) or (name.startswith("__") and not self.serve_dunder))
                ):
                    raise AttributeError(
                        f"attribute {str(name)[:40]!r} cannot be reached across the boundary"
                    )
                if op == "dunder":
                    if name not in DUNDERS:
                        raise AttributeError(f"operator {str(name)[:20]} cannot be used across the boundary")
                    result = getattr(obj, name)(*value)
                elif op == "call":
                    args, kwargs = value
                    result = self.on_call(obj, args, kwargs, msg.get("opts") or {})
                elif op == "getattr":
                    result = self.on_getattr(obj, name)
                elif op == "setattr":
                    setattr(obj, name, value)
                    result = None
                else:
                    raise WireError(f"unknown request {str(op)[:20]}")
            if result is REPLIED:
                return
            self.send({"kind": "reply"}, result, True)
        except (EOFError, BrokenPipeError):
            raise
        except BaseException as e:  # noqa: BLE001 - every failure is the other side's answer
            if isinstance(e, (KeyboardInterrupt,)):
                raise
            if isinstance(e, RemoteError):  # raised further along a nested call: pass the original on
                kind, message = e.kind, e.message
            else:
                kind, message = type(e).__name__, (str(e).splitlines() or [""])[0][:300]
            self.send({"kind": "reply", "error": kind, "message": message})


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_ALLOWED = ("torch.", "helpers.")


def _path(cls) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _memory_order(t) -> list | None:
    """The dims of a non-contiguous but dense view (a transpose) from outermost to innermost, else None."""
    if t.dim() < 2 or t.is_contiguous():
        return None
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    return order if t.permute(*order).is_contiguous() else None


def _importable(cls, prefixes=_ALLOWED) -> bool:
    """A class this boundary may name: torch's or the course's, importable by its module and name."""
    return cls.__module__.startswith(prefixes) and "." not in cls.__qualname__ and "<" not in cls.__qualname__


def _resolve(path: str, base: type, prefixes=_ALLOWED):
    """The class named by ``path`` ('module:Name'), only from torch or helpers, only a subclass of ``base``."""
    import importlib

    module, _, name = path.partition(":")
    if not module.startswith(prefixes) or not name.isidentifier():
        raise WireError(f"class {path[:60]} cannot cross")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise WireError(f"class {path[:60]} cannot cross")
    return cls


def _plain(v) -> bool:
    """A module attribute that is plain data (a flag, a size, an eps), never a function or an object."""
    if v is None or isinstance(v, (bool, int, float, str, torch.dtype)):
        return True
    if isinstance(v, (tuple, list)):
        return all(_plain(x) for x in v)
    return False


def stub_value(value) -> bool:
    """None, `...`, or a tuple/list/dict of only those: what a stub returns."""
    if value is None or value is Ellipsis:
        return True
    if isinstance(value, (list, tuple)) and value:
        return all(stub_value(v) for v in value)
    if isinstance(value, dict) and value:
        return all(stub_value(v) for v in value.values())
    return False


def values_only(value, depth: int = 0) -> bool:
    """Whether ``value`` crosses by value alone: plain data and tensors in tuples, lists and str-keyed dicts."""
    if depth > MAX_DEPTH:
        return False
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.Size)):
        return True
    if isinstance(value, torch.Tensor):
        return type(value) in (torch.Tensor, torch.nn.Parameter)
    if type(value) in (tuple, list):
        return all(values_only(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(isinstance(k, str) and values_only(v, depth + 1) for k, v in value.items())
    return False


def tensors(value, out: list | None = None) -> list:
    """Every tensor inside ``value`` (nested lists, tuples, dict values) in a fixed order, the same on both sides."""
    out = [] if out is None else out
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            tensors(v, out)
    return out


def _names(code) -> set:
    """Every global or free name a code object (and the code nested in it) reads."""
    out = set(code.co_names) | set(code.co_freevars)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            out |= _names(c) - set(c.co_varnames)
    return out


def _bad(node):
    raise WireError(f"bad value {str(node)[:40]}")
