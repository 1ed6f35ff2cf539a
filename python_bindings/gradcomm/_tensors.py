"""Turns numpy arrays and torch tensors into what the C++ module takes.

A collective gets (data pointer, numel, dtype name, device type, device index,
CUDA stream). Nothing is copied: the collectives work in place, so an input that
is not one contiguous block of memory, or is read-only, is refused (a copy would
silently leave the caller's array unchanged). Neither numpy nor torch is imported
here; an object is recognised only through modules the caller already imported.
"""
import sys
from typing import NamedTuple

# Names the C++ side parses (gradcomm::dtype_name).
_SUPPORTED = "float32, float16, bfloat16 (torch only), float64, int32, int64, uint8"
_NUMPY_DTYPES = {"float32", "float16", "float64", "int32", "int64", "uint8"}


class Buffer(NamedTuple):
    data: int  # address of the first element
    numel: int
    dtype: str  # "float32", ...
    device: str  # "cpu" | "cuda"
    device_index: int
    stream: int  # cudaStream_t of torch's current stream for CUDA tensors, else 0


def _torch_module():
    return sys.modules.get("torch")


def is_numpy(x) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def is_torch(x) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_dtype_name(torch, dtype):
    names = {
        torch.float32: "float32",
        torch.float16: "float16",
        torch.bfloat16: "bfloat16",
        torch.float64: "float64",
        torch.int32: "int32",
        torch.int64: "int64",
        torch.uint8: "uint8",
    }
    return names.get(dtype)


def describe(x, call: str, what: str, writable: bool) -> Buffer:
    """The Buffer for `x`, or TypeError/ValueError saying what is wrong with it.

    `call` and `what` name the collective and the argument in messages
    ("gradcomm.allreduce: tensor is not contiguous ...").
    """
    where = f"gradcomm.{call}: {what}"
    if is_numpy(x):
        return _describe_numpy(x, where, writable)
    if is_torch(x):
        return _describe_torch(x, where)
    raise TypeError(f"{where} must be a numpy.ndarray or a torch.Tensor, got {type(x).__module__}.{type(x).__qualname__}")


def _describe_numpy(x, where: str, writable: bool) -> Buffer:
    dtype = x.dtype
    if dtype.name not in _NUMPY_DTYPES:
        raise TypeError(f"{where} has dtype {dtype}, which gradcomm does not support; supported: {_SUPPORTED}")
    if not dtype.isnative:
        raise TypeError(f"{where} has non-native byte order ({dtype.str}); convert it with x.astype(x.dtype.newbyteorder('='))")
    if not x.flags.c_contiguous:
        raise ValueError(
            f"{where} is not contiguous (shape {x.shape}, strides {x.strides}); the operation works in place, so "
            "pass a contiguous array (numpy.ascontiguousarray) and use it afterwards")
    if writable and not x.flags.writeable:
        raise ValueError(f"{where} is read-only; the operation writes its result into it")
    return Buffer(x.__array_interface__["data"][0], int(x.size), dtype.name, "cpu", 0, 0)


def _describe_torch(x, where: str) -> Buffer:
    torch = _torch_module()
    if x.layout != torch.strided:
        raise TypeError(f"{where} has layout {x.layout}; gradcomm takes dense (strided) tensors only")
    name = _torch_dtype_name(torch, x.dtype)
    if name is None:
        raise TypeError(f"{where} has dtype {x.dtype}, which gradcomm does not support; supported: {_SUPPORTED}")
    if not x.is_contiguous():
        raise ValueError(
            f"{where} is not contiguous (shape {tuple(x.shape)}, strides {x.stride()}); the operation works in place, "
            "so pass a contiguous tensor (x.contiguous()) and use it afterwards")
    device = x.device
    if device.type == "cpu":
        return Buffer(x.data_ptr(), x.numel(), name, "cpu", 0, 0)
    if device.type == "cuda":
        # Stream-ordered on the caller's current stream, like torch's own collectives.
        stream = torch.cuda.current_stream(device).cuda_stream
        return Buffer(x.data_ptr(), x.numel(), name, "cuda", device.index or 0, int(stream))
    raise TypeError(f"{where} is on device '{device}'; gradcomm takes CPU and CUDA tensors")


def empty_like_shape(x, shape):
    """A new array/tensor of `shape`, x's dtype and device."""
    if is_numpy(x):
        np = sys.modules["numpy"]
        return np.empty(tuple(shape), dtype=x.dtype)
    torch = _torch_module()
    return torch.empty(tuple(shape), dtype=x.dtype, device=x.device)


def empty_like_gathered(x, world_size: int):
    """A new array/tensor of shape (world_size, *x.shape), x's dtype and device."""
    return empty_like_shape(x, (world_size,) + tuple(x.shape))
