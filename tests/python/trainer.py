"""The Python side of python_interop_test: a trainer that connects to the C++ test's
listener (FERRY_TEST_ADDRESS) or inherits its ends (FERRY_TEST_ENDS), and runs one
scenario; any failed assertion exits non-zero."""

import gc
import importlib
import os
import sys

import ferry

# torch and NumPy take seconds to import: only the scenarios that use them do.
np = None
torch = None


def import_tensor_libraries():
    global np, torch
    np = importlib.import_module("numpy")
    torch = importlib.import_module("torch")


def ends():
    """The loader's address to connect to (a Receiver, then a Sender), or inherited ends."""
    address = os.environ.get("FERRY_TEST_ADDRESS", "")
    if address:
        return [ferry.connect_receiver(address), ferry.connect_sender(address)]
    return [ferry._end_from_description(bytes.fromhex(text)) for text in os.environ["FERRY_TEST_ENDS"].split(",")]


def expect_end_of_stream(rx):
    for message in rx:
        raise AssertionError(f"expected the end of the stream, got {message!r}")


def shared_pages(rx, tx):
    batch = rx.recv()
    assert batch["step"] == 0
    images = torch.from_dlpack(batch["images"])
    assert images.shape == (4, 256) and images.dtype == torch.float32
    assert images.data_ptr() == batch["images"].data_ptr, "torch copied the tensor"
    total = float(images.sum())
    images[0, 0] = 42.0
    view = np.asarray(batch["images"])
    assert view.flags.writeable
    view[3, 255] = 43.0
    tx.send({"sum": total})
    expect_end_of_stream(rx)


def send_back(rx, tx):
    batch = rx.recv()
    as_torch = torch.from_dlpack(batch["t"])
    as_numpy = np.asarray(batch["t"])
    tx.send({"torch": as_torch[2:], "numpy": as_numpy[::2]})
    expect_end_of_stream(rx)


def hold_then_drop(rx, tx):
    held = None
    for message in rx:
        command = message["cmd"]
        if command == "hold":
            held = torch.from_dlpack(message["t"])
            del message  # only the torch tensor views the block now
            tx.send("holding")
        elif command == "probe":
            assert bool((torch.from_dlpack(message["t"]) == 9).all())
            assert bool((held == 7).all()), "the held block was overwritten"
            tx.send("ok")
        elif command == "drop":
            del held
            gc.collect()
            tx.send("dropped")
        elif command == "ping":
            tx.send("ok")


NUMPY_DTYPES = {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}


def dtypes(rx, tx):
    message = rx.recv()
    reply = {"error": None}
    try:
        for name in ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]:
            expected = np.arange(12).reshape(3, 4)
            if name == "bool":
                expected = expected % 2
            for suffix, view in (("", expected), ("_t", expected.T), ("_s", expected[:, 1:4:2])):
                tensor = message[name + suffix]
                assert tensor.dtype == name, (tensor.dtype, name)
                assert tensor.shape == view.shape, (name + suffix, tensor.shape, view.shape)
                if name != "bool":
                    as_torch = torch.from_dlpack(tensor)
                    assert str(as_torch.dtype) == "torch." + name
                    assert as_torch.data_ptr() == tensor.data_ptr
                    assert np.array_equal(as_torch.double().numpy(), view), name + suffix
                if name in NUMPY_DTYPES:
                    as_numpy = np.asarray(tensor)
                    assert as_numpy.dtype == np.dtype(name), (as_numpy.dtype, name)
                    assert np.array_equal(as_numpy.astype(np.float64), view), name + suffix
            torch_dtype = getattr(torch, name)
            pattern = torch.arange(12).reshape(3, 4)
            if name == "bool":
                pattern = pattern % 2
            reply["torch_" + name] = pattern.to(torch_dtype).t()
            if name in NUMPY_DTYPES:
                array = np.arange(12).reshape(3, 4)
                if name == "bool":
                    array = array % 2
                reply["numpy_" + name] = array.astype(name)[:, ::2]
    except AssertionError as error:
        reply = {"error": f"{type(error).__name__}: {error}"}
    tx.send(reply)
    expect_end_of_stream(rx)


def type_mismatch(rx, tx):
    try:
        rx.recv()
        raise AssertionError("a Python Receiver accepted a C++ Batch")
    except ferry.TypeMismatch as error:
        assert "Batch" in str(error), str(error)
        assert isinstance(error, ferry.ProtocolError)
    tx.send({"step": 1})


def connect_mismatch():
    try:
        ferry.connect_receiver(os.environ["FERRY_TEST_ADDRESS"], timeout=30)
        raise AssertionError("a Value receiver connected to a Batch sender")
    except ferry.TypeMismatch as error:
        assert "Batch" in str(error), str(error)


def hostile_nesting(rx):
    try:
        rx.recv()
        raise AssertionError("hostile nesting was accepted")
    except ferry.ProtocolError as error:
        assert "nests deeper than 64 levels" in str(error), str(error)


def duplicate_key(rx):
    try:
        rx.recv()
        raise AssertionError("a map with a duplicate key was accepted")
    except ferry.ProtocolError as error:
        assert "holds the key 'step' twice" in str(error), str(error)


def invalid_text(*receivers):
    """Each receiver gets one map whose string (even receivers) or key (odd ones) is not
    valid UTF-8."""
    for index, rx in enumerate(receivers):
        what = "map key" if index % 2 else "string"
        try:
            message = rx.recv()
            raise AssertionError(f"invalid UTF-8 in a {what} was accepted: {message!r}")
        except ferry.ProtocolError as error:
            assert f"received Value {what} is not valid UTF-8" in str(error), str(error)


def peer_died(rx):
    assert rx.recv() == {"hello": 1}
    try:
        rx.recv()
        raise AssertionError("no error after the loader was killed")
    except ferry.PeerDied as error:
        assert isinstance(error, ferry.ChannelClosed)


TENSOR_SCENARIOS = {"shared_pages", "send_back", "hold_then_drop", "dtypes"}

if __name__ == "__main__":
    if sys.argv[1] in TENSOR_SCENARIOS:
        import_tensor_libraries()
    if sys.argv[1] == "connect_mismatch":
        connect_mismatch()
    else:
        globals()[sys.argv[1]](*ends())
