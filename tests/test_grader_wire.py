"""The grading boundary (tools/grader/wire.py): values cross by value, nothing decodes into code, objects stay home."""

import math
import os
import struct
import threading

import pytest
import torch
import wire  # noqa: E402


def roundtrip(value):
    """Encode on one peer, decode on the other (no pipes needed)."""
    a, b = wire.Peer(None, None), wire.Peer(None, None)
    blobs = []
    node = a.encode(value, blobs)
    return b.decode(node, blobs)


@pytest.mark.parametrize("dtype", sorted(wire.DTYPES.values(), key=str))
def test_tensors_of_every_allowed_dtype_and_shape_cross_bit_for_bit(dtype):
    for shape in [(), (0,), (3,), (2, 3, 4)]:
        t = (torch.arange(math.prod(shape) or 0, dtype=torch.float64).reshape(shape) * 1.7 - 2).to(dtype)
        back = roundtrip(t)
        assert back.dtype == dtype and back.shape == t.shape and torch.equal(back, t)


def test_a_meta_tensor_crosses_as_its_shape_and_dtype():
    """A mask made where a case's device="meta" said: no values to send, only where, what shape, what dtype."""
    back = roundtrip((torch.empty(2, 5, dtype=torch.bool, device="meta"),))[0]
    assert back.device.type == "meta" and back.shape == (2, 5) and back.dtype == torch.bool
    with pytest.raises(wire.WireError, match="bad tensor header"):
        wire.Peer(None, None).decode({"meta": [2, -1], "dtype": "bool"}, [])


def test_grad_flags_parameters_grads_and_containers_survive():
    w = torch.nn.Parameter(torch.ones(2, 2))
    w.grad = torch.full((2, 2), 3.0)
    x = torch.zeros(3, requires_grad=True)
    value = {
        "w": w,
        "x": x,
        "t": (1, 2.5, float("nan"), float("-inf"), 2**70, None, True, "s"),
        "l": [torch.float16, torch.Size([2, 3])],
        4: "int key",
    }
    back = roundtrip(value)
    assert isinstance(back["w"], torch.nn.Parameter) and torch.equal(back["w"].grad, w.grad)
    assert back["x"].requires_grad and back["x"].grad is None
    t = back["t"]
    assert (
        t[:2] == (1, 2.5)
        and math.isnan(t[2])
        and t[3] == -math.inf
        and t[4] == 2**70
        and t[5:] == (None, True, "s")
    )
    assert back["l"] == [torch.float16, torch.Size([2, 3])] and back[4] == "int key"


def test_a_noncontiguous_view_crosses_as_its_values():
    t = torch.arange(12.0).reshape(3, 4).T[1:]
    assert torch.equal(roundtrip(t), t)


@pytest.mark.parametrize(
    "node, blobs, why",
    [
        ({"tensor": 0, "dtype": "object", "shape": [1]}, [b"x"], "bad tensor header"),
        ({"tensor": 0, "dtype": "float32", "shape": [2]}, [b"\x00" * 4], "do not match"),
        ({"tensor": 0, "dtype": "float32", "shape": [-1]}, [b""], "bad tensor header"),
        ({"pickle": "gASVAAAAAAAAAAB9lC4="}, [], "bad value"),
        ({"float": "__import__('os')"}, [], "bad value"),
        ({"yours": 99}, [], "unknown handle"),
        ({"dtype_of": "torch.storage"}, [], "bad value"),
    ],
)
def test_malformed_or_code_carrying_values_are_refused(node, blobs, why):
    with pytest.raises(wire.WireError, match=why):
        wire.Peer(None, None).decode(node, blobs)


def test_oversized_messages_are_refused_before_reading_them():
    r, w = os.pipe()
    os.write(w, struct.pack("<QI", wire.MAX_HEADER + 1, 0))
    peer = wire.Peer(os.fdopen(r, "rb", buffering=0), None)
    with pytest.raises(wire.WireError, match="too large"):
        peer.receive()


@pytest.mark.parametrize("write", ["in place", "through .data"])
def test_a_module_changed_on_the_other_side_comes_back_as_it_was_changed(write):
    """The sender's layer ends with the values the far side left, and its version counter moves only
    where the far side's did: a write through ``.data`` (values only) reads the same on both sides, so
    a hidden test sees what the self-check sees (lab 8 ex4: `layer.weight.data += …` got ✗ in the
    self-check and 2/2 in the hidden tests, two newcomers)."""
    a, b = wire.Peer(None, None), wire.Peer(None, None)
    layer = torch.nn.Linear(3, 2).requires_grad_(False)
    version = layer.weight._version
    blobs = []
    far = b.decode(a.encode(layer, blobs), blobs)
    with torch.no_grad():
        (far.weight if write == "in place" else far.weight.data).add_(1.0)
    blobs = []
    a.apply_echo(a.decode(b.encode(b.module_echo(), blobs), blobs))
    assert torch.equal(layer.weight, far.weight)
    assert (layer.weight._version != version) is (write == "in place")


class Thing:
    """An object that stays on its side: the other side holds a handle."""

    def __init__(self, v):
        self.v = v
        self._private = "underscore names are reachable"

    def __add__(self, other):
        return Thing(self.v + (other.v if isinstance(other, Thing) else other))

    def twice(self, f):
        return f(self.v) * 2  # f is the other side's callable: a nested call back


def serve_forever(peer):
    try:
        while True:
            msg, blobs = peer.receive()
            peer.serve(msg, blobs)
    except EOFError:
        pass


@pytest.fixture
def pair():
    """(client peer, server peer) over two pipes, the server answering in a thread."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    client = wire.Peer(os.fdopen(r2, "rb", buffering=0), os.fdopen(w1, "wb"))
    server = wire.Peer(os.fdopen(r1, "rb", buffering=0), os.fdopen(w2, "wb"))
    server.handlers["thing"] = lambda msg, v: Thing(v)
    t = threading.Thread(target=serve_forever, args=(server,), daemon=True)
    t.start()
    yield client, server
    client.wfile.close()
    t.join(5)


def test_objects_cross_as_handles_with_calls_attributes_operators_and_callbacks(pair):
    client, server = pair
    thing = client.request({"op": "thing"}, 20, True)
    assert isinstance(thing, wire.Remote) and thing.v == 20 and thing._private.startswith("underscore")
    thing.v = 5
    assert thing.v == 5
    assert (thing + 1).v == 6  # an operator, served on its side
    assert thing.twice(lambda v: v + 0.5) == 11.0  # the server calls back into the client
    assert client.request({"op": "thing"}, thing, True).v.v == 5  # a handle sent back is the object itself


def test_dunder_attributes_are_not_served_unless_the_peer_allows_it(pair):
    client, server = pair
    thing = client.request({"op": "thing"}, 1, True)
    with pytest.raises(AttributeError):
        _ = thing.__dict__  # refused locally: no request sent
    with pytest.raises(wire.RemoteError, match="AttributeError"):
        client.request({"op": "getattr", "ref": thing._id, "name": "__class__"})
    method = thing.twice
    with pytest.raises(wire.RemoteError, match="AttributeError"):
        client.request({"op": "getattr", "ref": method._id, "name": "__globals__"})
    with pytest.raises(wire.RemoteError, match="cannot be"):
        client.request({"op": "dunder", "ref": thing._id, "name": "__reduce__"}, (), True)


def test_a_raise_on_the_other_side_is_an_error_reply_not_a_hang(pair):
    client, _ = pair
    thing = client.request({"op": "thing"}, 1, True)
    with pytest.raises(wire.RemoteError) as e:
        thing.twice(lambda v: 1 / 0)
    assert e.value.kind == "ZeroDivisionError"


def test_a_return_too_large_to_cross_is_an_error_reply_and_the_stream_stays_in_step(pair):
    """A student's function returning expanded zeros (4 × 64 MiB) took 31 s of a grading to cross: the
    sender refuses it before writing a byte, the caller gets an error, the next request is answered."""
    client, server = pair
    server.handlers["big"] = lambda msg, n: torch.zeros(1, dtype=torch.float64).expand(n)
    fits = client.request({"op": "big"}, wire.MAX_BLOBS // 8, True)
    assert fits.shape == (wire.MAX_BLOBS // 8,)
    with pytest.raises(wire.RemoteError, match="WireError") as e:
        client.request({"op": "big"}, wire.MAX_BLOBS // 8 + 1, True)
    assert "cannot cross" in e.value.message
    assert client.request({"op": "big"}, 3, True).tolist() == [0.0] * 3


def test_a_silent_peer_times_out():
    r, w = os.pipe()
    peer = wire.Peer(os.fdopen(r, "rb", buffering=0), None)
    peer.deadline = 0.0
    with pytest.raises(TimeoutError):
        peer.receive()
    os.close(w)


def test_a_device_crosses_by_name_and_only_a_device_name_is_decoded():
    """causal_mask(N, device=Q.device), called back across the boundary, hands over a torch.device."""
    assert roundtrip(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(wire.WireError):
        wire.Peer(None, None).decode({"device": "cpu; import os"}, [])


def test_values_only_tells_what_a_forked_call_may_send_back():
    assert wire.values_only((torch.ones(2), None, [1.5, "s"], {"k": torch.Size([2])}))
    assert not wire.values_only((torch.ones(2), object()))
    assert not wire.values_only({1: torch.ones(2)})


def test_tensor_bytes_are_sent_without_a_copy():
    """A capped call (worker.capped) sends 64 MiB within a 16 MiB budget: the blob is the tensor's memory."""
    t = torch.arange(6.0, dtype=torch.float64)
    blobs = wire.Blobs()
    wire.Peer(None, None).encode(t, blobs)
    assert isinstance(blobs[0], memoryview) and blobs[0].nbytes == 48
    t[0] = 7.0
    assert bytes(blobs[0][:8]) == struct.pack("<d", 7.0)
