"""A minimal writer of the safetensors format: an 8-byte little-endian header length, a JSON
header naming each tensor's dtype, shape and byte range, padded to 8 bytes, then the data."""

import json
import struct

import torch

SAFETENSORS_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
HEADER_ALIGNMENT_BYTES = 8


def tensor_bytes(tensor):
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)  # numpy has no bfloat16; the bits are what we store
    return tensor.numpy().tobytes()


def write_safetensors(path, tensors, metadata=None):
    """Writes named tensors (a dict) in name order, the way the safetensors library does."""
    header = {"__metadata__": metadata or {"format": "pt"}}
    payloads = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        data = tensor_bytes(tensor)
        header[name] = {
            "dtype": SAFETENSORS_DTYPE[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        payloads.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % HEADER_ALIGNMENT_BYTES)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for data in payloads:
            f.write(data)


def read_safetensors(path):
    """Tensors by name from a safetensors file (the dtypes this writer produces)."""
    by_name = {dtype_name: dtype for dtype, dtype_name in SAFETENSORS_DTYPE.items()}
    with open(path, "rb") as f:
        (header_length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_length))
        data = f.read()
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        dtype = by_name[entry["dtype"]]
        storage_dtype = torch.int16 if dtype == torch.bfloat16 else dtype
        flat = torch.frombuffer(bytearray(data[start:end]), dtype=storage_dtype)
        tensors[name] = flat.view(dtype).reshape(entry["shape"])
    return tensors
