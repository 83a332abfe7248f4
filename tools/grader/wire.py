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
import select
import struct
import time
from typing import Any, BinaryIO, Callable

import torch

MAX_HEADER = 64 << 20     # bytes of JSON in one message
MAX_BLOBS = 1 << 30       # tensor bytes in one message
MAX_DEPTH = 64            # nesting of lists, tuples and dicts
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}


class WireError(Exception):
    """The other side sent something that is not a well-formed message."""


class RemoteError(Exception):
    """The other side raised while serving a request: ``kind`` is its exception's type name."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind, self.message = kind, message


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
        return self._op(name, *args)
    method.__name__ = name
    return method


# operators a test may apply to a student's object (a micrograd Value: `power(y, 0.5) + power(y, -1)`)
DUNDERS = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
           "__pow__", "__rpow__", "__neg__", "__matmul__", "__rmatmul__", "__getitem__", "__len__",
           "__float__", "__int__", "__bool__", "__lt__", "__le__", "__gt__", "__ge__")
for _name in DUNDERS:
    setattr(Remote, _name, _dunder(_name))


class Peer:
    """One end of the boundary: encodes, decodes, sends requests and serves the other end's."""

    def __init__(self, rfile: BinaryIO, wfile: BinaryIO, *, serve_dunder: bool = False,
                 on_call: Callable | None = None):
        self.rfile, self.wfile = rfile, wfile
        self.objects: dict[int, Any] = {}          # handles this side gave out
        self.ids: dict[int, int] = {}              # id(obj) -> handle
        self.remotes: dict[int, Remote] = {}       # the other side's handles, one Remote each (keeps `is`)
        self.serve_dunder = serve_dunder
        self.on_call = on_call or (lambda fn, args, kwargs, opts: fn(*args, **kwargs))
        self.handlers: dict[str, Callable] = {}

    # ------------------------------------------------------------------ values

    def encode(self, obj, blobs: list, depth: int = 0):
        """A JSON-able tree for ``obj``; tensor bytes go to ``blobs``."""
        if depth > MAX_DEPTH:
            raise WireError("value nested too deeply")
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if obj is Ellipsis:   # a stub's `...`
            return {"ellipsis": True}
        if isinstance(obj, int):
            return obj if abs(obj) < 2 ** 62 else {"bigint": str(obj)}
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else {"float": repr(obj)}
        if isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.layout == torch.strided:
            t = obj.detach().to("cpu").contiguous()
            dtype = str(t.dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                raise WireError(f"tensor dtype {dtype} cannot cross")
            blobs.append(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            node = {"tensor": len(blobs) - 1, "dtype": dtype, "shape": list(t.shape),
                    "grad": bool(obj.requires_grad), "param": isinstance(obj, torch.nn.Parameter)}
            if obj.is_leaf and obj.grad is not None:  # a leaf's .grad travels with it (clipping edits it)
                node["dot_grad"] = self.encode(obj.grad, blobs, depth + 1)
            return node
        if isinstance(obj, torch.dtype):
            return {"dtype_of": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.Size):
            return {"size": [int(s) for s in obj]}
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            return {"list" if isinstance(obj, list) else "tuple": [self.encode(x, blobs, depth + 1) for x in obj]}
        if type(obj) is dict and all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in obj):
            return {"dict": [[k, self.encode(v, blobs, depth + 1)] for k, v in obj.items()]}
        if isinstance(obj, Remote) and obj._peer is self:
            return {"yours": obj._id}
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
        if "tensor" in node:
            dtype = DTYPES.get(node.get("dtype"))
            shape = node.get("shape")
            if dtype is None or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
                raise WireError("bad tensor header")
            raw = blobs[node["tensor"]]
            n = math.prod(shape)
            if len(raw) != n * torch.empty((), dtype=dtype).element_size():
                raise WireError("tensor bytes do not match its shape")
            t = (torch.frombuffer(bytearray(raw), dtype=dtype) if n else torch.empty(0, dtype=dtype)).reshape(shape)
            if node.get("param"):
                t = torch.nn.Parameter(t, requires_grad=bool(node.get("grad")))
            elif node.get("grad") and (t.is_floating_point() or t.is_complex()):
                t.requires_grad_()
            if "dot_grad" in node:
                g = self.decode(node["dot_grad"], blobs, depth + 1)
                if not isinstance(g, torch.Tensor) or g.shape != t.shape or g.dtype != t.dtype:
                    raise WireError("a .grad that does not fit its tensor")
                t.grad = g
            return t
        if "float" in node:
            return float(node["float"]) if node["float"] in ("nan", "inf", "-inf") else _bad(node)
        if "ellipsis" in node:
            return Ellipsis
        if "bigint" in node:
            return int(node["bigint"])
        if "dtype_of" in node:
            return DTYPES[node["dtype_of"]] if node["dtype_of"] in DTYPES else _bad(node)
        if "size" in node:
            return torch.Size([int(s) for s in node["size"]])
        if "list" in node:
            return [self.decode(x, blobs, depth + 1) for x in node["list"]]
        if "tuple" in node:
            return tuple(self.decode(x, blobs, depth + 1) for x in node["tuple"])
        if "dict" in node:
            return {(k if isinstance(k, (str, int)) else _bad(node)): self.decode(v, blobs, depth + 1)
                    for k, v in node["dict"]}
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

    # ---------------------------------------------------------------- messages

    def send(self, header: dict, value=None, has_value: bool = False) -> None:
        blobs: list[bytes] = []
        if has_value:
            header = dict(header, value=self.encode(value, blobs))
        head = json.dumps(header, allow_nan=False).encode()
        self.wfile.write(struct.pack("<QI", len(head), len(blobs)) + head)
        for b in blobs:
            self.wfile.write(struct.pack("<Q", len(b)) + b)
        self.wfile.flush()

    def receive(self) -> tuple[dict, list[bytes]]:
        n_head, n_blobs = struct.unpack("<QI", self._read(12))
        if n_head > MAX_HEADER or n_blobs > 1 << 20:
            raise WireError("message too large")
        header = json.loads(self._read(n_head))
        blobs, total = [], 0
        for _ in range(n_blobs):
            (n,) = struct.unpack("<Q", self._read(8))
            total += n
            if total > MAX_BLOBS:
                raise WireError("message too large")
            blobs.append(self._read(n))
        if not isinstance(header, dict):
            raise WireError("bad header")
        return header, blobs

    deadline: float | None = None   # time.monotonic() after which a read raises TimeoutError

    def _read(self, n: int) -> bytes:
        chunks, fd = [], self.rfile.fileno()
        while n:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError("no answer before the time limit")
            data = os.read(fd, min(n, 1 << 20))
            if not data:
                raise EOFError("the other side closed the connection")
            chunks.append(data)
            n -= len(data)
        return b"".join(chunks)

    # ---------------------------------------------------------------- requests

    def request(self, header: dict, value=None, has_value: bool | None = None):
        """Send a request and serve the other side until its reply comes; return the reply's value."""
        self.send(dict(header, kind="request"), value, has_value if has_value is not None else value is not None)
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
                if op in ("getattr", "setattr", "dunder") and name not in DUNDERS and (not isinstance(name, str) or
                                                       (name.startswith("__") and not self.serve_dunder)):
                    raise AttributeError(f"attribute {str(name)[:40]!r} cannot be reached across the boundary")
                if op == "dunder":
                    if name not in DUNDERS:
                        raise AttributeError(f"operator {str(name)[:20]} cannot be used across the boundary")
                    result = getattr(obj, name)(*value)
                elif op == "call":
                    args, kwargs = value
                    result = self.on_call(obj, args, kwargs, msg.get("opts") or {})
                elif op == "getattr":
                    result = getattr(obj, name)
                elif op == "setattr":
                    setattr(obj, name, value)
                    result = None
                else:
                    raise WireError(f"unknown request {str(op)[:20]}")
            self.send({"kind": "reply"}, result, True)
        except (EOFError, BrokenPipeError):
            raise
        except BaseException as e:  # noqa: BLE001 - every failure is the other side's answer
            if isinstance(e, (KeyboardInterrupt,)):
                raise
            if isinstance(e, RemoteError):   # raised further along a nested call: pass the original on
                kind, message = e.kind, e.message
            else:
                kind, message = type(e).__name__, (str(e).splitlines() or [""])[0][:300]
            self.send({"kind": "reply", "error": kind, "message": message})


def _bad(node):
    raise WireError(f"bad value {str(node)[:40]}")
