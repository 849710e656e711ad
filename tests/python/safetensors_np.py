"""A small safetensors reader for the tests (NumPy only): the tests check
dsmla's outputs against the files `dsmla run` writes without going through
dsmla's own reader."""
import json
import struct

import numpy as np

DTYPES = {"BF16": np.uint16, "F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64,
          "U8": np.uint8, "I8": np.int8, "I16": np.int16, "F16": np.float16, "BOOL": np.bool_}


def _header(raw):
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), 8 + n


def read(path):
    """{name: (dtype string, ndarray)} and the metadata dict; BF16 as uint16 bits."""
    raw = open(path, "rb").read()
    header, base = _header(raw)
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        lo, hi = t["data_offsets"]
        a = np.frombuffer(raw[base + lo:base + hi], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        tensors[name] = (t["dtype"], a)
    return tensors, meta


def patch(path, name, flat_index, value):
    """Overwrites one element of a tensor in place (to make bad inputs)."""
    raw = bytearray(open(path, "rb").read())
    header, base = _header(bytes(raw))
    t = header[name]
    dt = np.dtype(DTYPES[t["dtype"]])
    off = base + t["data_offsets"][0] + flat_index * dt.itemsize
    raw[off:off + dt.itemsize] = np.array([value], dtype=dt).tobytes()
    open(path, "wb").write(bytes(raw))
